//! Server functions of the tenant's `/usage` and `/logs` pages: aggregated usage and the request
//! log, always scoped by the session's tenant.
