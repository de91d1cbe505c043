//! Server functions of the tenant's `/keys` page: create, list, revoke and rotate API keys.
