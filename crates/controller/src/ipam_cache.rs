//! The IPAM ConfigMap as this process knows it, shared by every negotiation.

use k8s_openapi::api::core::v1::ConfigMap;

/// The IPAM ConfigMap as this process last read or wrote it (`Some(None)`: known absent),
/// behind the lock every IPAM change of this process takes. Negotiations with many peers at
/// once queue here instead of conflicting on the one ConfigMap, and one whose peer is already
/// mapped costs no request. Writes are guarded by the cached resourceVersion, so a change made
/// elsewhere (the ConfigMap is the controller's alone; the leader is the only writer) is read
/// again on the conflict it causes.
#[derive(Default)]
pub struct IpamCache(pub(crate) tokio::sync::Mutex<Option<Option<ConfigMap>>>);
