//! What marks a node as virtual, for the placement rules of both sides: the consumer's webhook
//! keeps DaemonSet pods off virtual nodes, the provider keeps a tenant's real pods off its own.

use tandem_api::names;
use tandem_core::offloading::VirtualNodeMarks;

/// What marks a node as virtual (label and NoExecute taint, as `desired_node` sets them), for
/// the placement rules that keep pods on or off virtual nodes.
pub const MARKS: VirtualNodeMarks<'static> = VirtualNodeMarks {
    type_label: names::NODE_TYPE_LABEL,
    type_value: names::VIRTUAL_NODE_TYPE,
    taint_key: names::VIRTUAL_NODE_TAINT,
};
