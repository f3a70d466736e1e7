/** An ActionApproval's expiry when neither its rule nor ACTION_APPROVAL_EXPIRY_SECONDS says otherwise: 24 hours. */
export const DEFAULT_APPROVAL_EXPIRY_SECONDS = 24 * 3600;
/** No ActionApproval waits longer than 7 days. */
export const MAX_APPROVAL_EXPIRY_SECONDS = 7 * 24 * 3600;
