//! Tandem's admin library: what an administrator does to a cluster, as the CLI (`tandem
//! install`, `invite`, `peer`, `advertise`, `enroll`, `approve`, `unpeer`, `rotate`, `uninstall`) and the
//! tests do it — beside the controller, never inside it. Each step talks to one cluster through
//! `kube::Client` and leaves the rest to the controller running there.
//!
//! - [`install`]: the manifests (CRDs, RBAC, settings, the controller Deployment) and their
//!   server-side apply, CoreDNS's stub domain for `clusterset.local`;
//! - [`invite`]: invites on the provider, accepting one on the consumer, waiting for the
//!   Peering, unpeering;
//! - [`enroll`]: the enrollment credential, deciding requests, enrolling with a provider found
//!   by discovery;
//! - [`rotate`]: a new webhook serving certificate or new WireGuard keys, now;
//! - [`uninstall`]: unpeering from every peer, then removing what `install` created.

pub mod endpoint;
pub mod enroll;
pub mod install;
pub mod invite;
pub mod rollout;
pub mod rotate;
pub mod uninstall;
