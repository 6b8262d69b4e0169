//! The controller's end-to-end tests against lab clusters, in one test binary (one link of
//! kube, the API server and the lab instead of one per file): each file below is a module and
//! keeps its tests' names. The hostile-peer suite is its own binary (`tests/hostile`).

mod daemonsets;
mod e2e;
mod forbidden;
mod jobs;
mod kubelet_api;
mod leader;
mod mcs;
mod mdns;
mod module_graph;
mod offload_pods;
mod offloading;
mod partition;
mod peering;
mod reflection;
mod renewal;
mod smoke;
mod soak;
mod storage;
mod support;
mod webhook_rotation;
