//! The API server's integration tests through kube-rs and kubectl, in one test binary (one
//! link instead of one per file): each file below is a module and keeps its tests' names. The
//! module-graph check stays its own binary (it reads sources and links nothing else).

mod kube_rs;
mod kubectl;
