//! Lab cluster integration tests: a real API server with the scheduler, hollow kubelets and
//! the node lifecycle controller, driven through kube-rs and kubectl as a user would.

#[path = "lab/support.rs"]
mod support;

#[path = "lab/nodes.rs"]
mod nodes;

#[path = "lab/scheduling.rs"]
mod scheduling;

#[path = "lab/pods.rs"]
mod pods;

#[path = "lab/statefulsets.rs"]
mod statefulsets;

#[path = "lab/volumes.rs"]
mod volumes;

#[path = "lab/module_graph.rs"]
mod module_graph;
