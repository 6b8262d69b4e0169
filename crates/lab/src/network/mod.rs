//! Network mode: lab pods with real network namespaces, built-in programs, Services that
//! route (nftables), cluster DNS and kubelet endpoints for `kubectl logs` and `exec`.
//!
//! Hollow mode (the default) uses none of this. Network mode needs root; everything it
//! creates lives in network namespaces named `lab-<instance>-…`, never in the host's own.

pub mod netns;
pub mod runtime;
