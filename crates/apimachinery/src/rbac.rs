//! RBAC: evaluation of Roles, ClusterRoles and their bindings for a request.
