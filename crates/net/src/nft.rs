//! Renders a [`NatPlan`] to nftables and reconciles the kernel's table with it.
//!
//! Every rule carries a comment with a hash of its chain and text, so reconciling is a
//! set difference: rules whose hash is not wanted (stale plans, crashed runs, duplicates)
//! are deleted by handle and missing ones are added, all in one `nft -f` transaction.
//! Re-applying the same plan sends nothing. The `nftables` crate cannot express prefix
//! NAT (`snat ip prefix to`), so the ruleset is generated as text, as kube-proxy does.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::Stdio;

use ipnet::IpNet;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use tandem_core::nat::NatPlan;
use tokio::io::AsyncWriteExt;

/// Prefix of the comment that marks (and hashes) every rule Tandem owns.
const ID_PREFIX: &str = "tandem:";

/// Errors talking to nftables.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The `nft` binary could not be run.
    #[error("running `nft {args}`: {source}")]
    Spawn {
        /// The arguments.
        args: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// `nft` rejected a command.
    #[error("`nft {args}` failed: {stderr}")]
    Failed {
        /// The arguments.
        args: String,
        /// What nft printed.
        stderr: String,
    },
    /// `nft -j` printed something we could not read.
    #[error("reading `nft -j list table` output: {0}")]
    Parse(#[from] serde_json::Error),
}

/// A base chain of the gateway's table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChainSpec {
    /// Chain name.
    pub name: &'static str,
    /// `nat` or `filter`.
    pub kind: &'static str,
    /// Netfilter hook.
    pub hook: &'static str,
    /// Numeric priority (dstnat = -100, srcnat = 100, mangle = -150).
    pub priority: i64,
}

/// One rule, identified by the hash of its chain and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// Chain the rule belongs to.
    pub chain: &'static str,
    /// Rule text without comment.
    pub body: String,
    /// `tandem:<hash>`, stored as the rule comment.
    pub id: String,
}

/// The table the gateway wants in the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ruleset {
    /// Table name (family `inet`).
    pub table: String,
    /// Its base chains.
    pub chains: Vec<ChainSpec>,
    /// Its rules.
    pub rules: Vec<RuleSpec>,
}

const NAT_IN: ChainSpec = ChainSpec {
    name: "nat_in",
    kind: "nat",
    hook: "prerouting",
    priority: -100,
};
const NAT_OUT: ChainSpec = ChainSpec {
    name: "nat_out",
    kind: "nat",
    hook: "postrouting",
    priority: 100,
};
const MSS: ChainSpec = ChainSpec {
    name: "mss_clamp",
    kind: "filter",
    hook: "forward",
    priority: -150,
};
/// Least exposure, for what the peer opens through the tunnel: after the destination NAT, to
/// pods (forward) and to the gateway's own node (input).
const EXPOSE_FORWARD: ChainSpec = ChainSpec {
    name: "expose_forward",
    kind: "filter",
    hook: "forward",
    priority: 0,
};
const EXPOSE_INPUT: ChainSpec = ChainSpec {
    name: "expose_input",
    kind: "filter",
    hook: "input",
    priority: 0,
};

fn family_kw(net: &IpNet) -> &'static str {
    match net {
        IpNet::V4(_) => "ip",
        IpNet::V6(_) => "ip6",
    }
}

fn rule(chain: &'static str, body: String) -> RuleSpec {
    let digest = Sha256::digest(format!("{chain}\n{body}").as_bytes());
    let mut id = String::from(ID_PREFIX);
    for b in &digest[..8] {
        let _ = write!(id, "{b:02x}");
    }
    RuleSpec { chain, body, id }
}

/// The ruleset for `plan` on tunnel interface `tun` with the given MTU; with `allowed`, new
/// connections from the tunnel reach only those destinations (and never the node itself).
pub fn render(
    plan: &NatPlan,
    table: &str,
    tun: &str,
    mtu: u16,
    allowed: Option<&[IpNet]>,
) -> Ruleset {
    let mut rules = Vec::new();
    let mut chains = vec![NAT_IN, NAT_OUT, MSS];
    if let Some(allowed) = allowed {
        chains.extend([EXPOSE_FORWARD, EXPOSE_INPUT]);
        for (proto, f, v4) in [("ipv4", "ip", true), ("ipv6", "ip6", false)] {
            let members: Vec<String> = allowed
                .iter()
                .filter(|n| matches!(n, IpNet::V4(_)) == v4)
                .map(ToString::to_string)
                .collect();
            let body = if members.is_empty() {
                format!(
                    "iifname \"{tun}\" meta nfproto {proto} ct state != {{ established, related }} drop"
                )
            } else {
                format!(
                    "iifname \"{tun}\" meta nfproto {proto} ct state != {{ established, related }} {f} daddr != {{ {} }} drop",
                    members.join(", ")
                )
            };
            rules.push(rule(EXPOSE_FORWARD.name, body));
        }
        rules.push(rule(
            EXPOSE_INPUT.name,
            format!("iifname \"{tun}\" ct state != {{ established, related }} drop"),
        ));
    }
    for t in &plan.dnat_from_tunnel {
        let f = family_kw(&t.from);
        rules.push(rule(
            NAT_IN.name,
            format!(
                "iifname \"{tun}\" {f} daddr {} dnat {f} prefix to {}",
                t.from, t.to
            ),
        ));
    }
    for t in &plan.snat_to_tunnel {
        let f = family_kw(&t.from);
        rules.push(rule(
            NAT_OUT.name,
            format!(
                "oifname \"{tun}\" {f} saddr {} snat {f} prefix to {}",
                t.from, t.to
            ),
        ));
    }
    let unknown = &plan.unknown_source;
    let f = match unknown.to {
        std::net::IpAddr::V4(_) => "ip",
        std::net::IpAddr::V6(_) => "ip6",
    };
    let except: Vec<String> = unknown.except.iter().map(ToString::to_string).collect();
    rules.push(rule(
        NAT_OUT.name,
        format!(
            "oifname \"{tun}\" meta nfproto {} {f} saddr != {{ {} }} snat {f} to {}",
            if f == "ip" { "ipv4" } else { "ipv6" },
            except.join(", "),
            unknown.to
        ),
    ));
    // Clamp TCP MSS both ways so no endpoint sends segments the tunnel must fragment:
    // leaving, to the route MTU; arriving, to what fits in the tunnel MTU (IPv4 + TCP headers).
    rules.push(rule(
        MSS.name,
        format!("oifname \"{tun}\" tcp flags syn / syn,rst tcp option maxseg size set rt mtu"),
    ));
    rules.push(rule(
        MSS.name,
        format!(
            "iifname \"{tun}\" meta nfproto ipv4 tcp flags syn / syn,rst tcp option maxseg size set {}",
            mtu.saturating_sub(40)
        ),
    ));
    rules.push(rule(
        MSS.name,
        format!(
            "iifname \"{tun}\" meta nfproto ipv6 tcp flags syn / syn,rst tcp option maxseg size set {}",
            mtu.saturating_sub(60)
        ),
    ));
    Ruleset {
        table: table.to_string(),
        chains,
        rules,
    }
}

/// A chain as listed by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentChain {
    /// Name.
    pub name: String,
    /// Type, hook and priority if it is a base chain.
    pub base: Option<(String, String, i64)>,
}

/// A rule as listed by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CurrentRule {
    /// Chain.
    pub chain: String,
    /// Kernel handle, for deletion.
    pub handle: u64,
    /// Comment, where Tandem keeps the rule's hash.
    pub comment: Option<String>,
}

/// The table as it is in the kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CurrentTable {
    /// Chains.
    pub chains: Vec<CurrentChain>,
    /// Rules, in listing order.
    pub rules: Vec<CurrentRule>,
}

#[derive(Deserialize)]
struct Listing {
    nftables: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
struct JsonChain {
    name: String,
    #[serde(rename = "type")]
    kind: Option<String>,
    hook: Option<String>,
    prio: Option<i64>,
}

#[derive(Deserialize)]
struct JsonRule {
    chain: String,
    handle: u64,
    comment: Option<String>,
}

/// Reads the output of `nft -j list table inet <table>`.
pub fn parse_listing(json: &str) -> Result<CurrentTable, NftError> {
    let listing: Listing = serde_json::from_str(json)?;
    let mut table = CurrentTable::default();
    for item in listing.nftables {
        if let Some(c) = item.get("chain") {
            let c: JsonChain = serde_json::from_value(c.clone())?;
            let base = match (c.kind, c.hook, c.prio) {
                (Some(k), Some(h), Some(p)) => Some((k, h, p)),
                _ => None,
            };
            table.chains.push(CurrentChain { name: c.name, base });
        } else if let Some(r) = item.get("rule") {
            let r: JsonRule = serde_json::from_value(r.clone())?;
            table.rules.push(CurrentRule {
                chain: r.chain,
                handle: r.handle,
                comment: r.comment,
            });
        }
    }
    Ok(table)
}

/// The `nft -f` script turning `current` (None: no table) into `desired`, or None when
/// they already match.
pub fn reconcile_script(desired: &Ruleset, current: Option<&CurrentTable>) -> Option<String> {
    let t = &desired.table;
    let empty = CurrentTable::default();
    let cur = current.unwrap_or(&empty);
    let mut script = String::new();
    let mut changed = current.is_none();
    let _ = writeln!(script, "add table inet {t}");

    let mut recreated: BTreeSet<&str> = BTreeSet::new();
    for c in &cur.chains {
        let wanted = desired.chains.iter().find(|d| d.name == c.name);
        let matches = wanted.is_some_and(|d| {
            c.base.as_ref() == Some(&(d.kind.to_string(), d.hook.to_string(), d.priority))
        });
        if !matches {
            // Unknown chain or wrong hook: drop it whole (a chain must be empty to delete).
            let _ = writeln!(script, "flush chain inet {t} {}", c.name);
            let _ = writeln!(script, "delete chain inet {t} {}", c.name);
            changed = true;
            if let Some(d) = wanted {
                recreated.insert(d.name);
            }
        }
    }
    for d in &desired.chains {
        let exists = cur.chains.iter().any(|c| c.name == d.name) && !recreated.contains(d.name);
        if !exists {
            let _ = writeln!(
                script,
                "add chain inet {t} {} {{ type {} hook {} priority {}; policy accept; }}",
                d.name, d.kind, d.hook, d.priority
            );
            changed = true;
        }
    }

    let mut present: BTreeSet<(&str, &str)> = BTreeSet::new();
    for r in &cur.rules {
        if recreated.contains(r.chain.as_str()) {
            continue;
        }
        let Some(chain) = desired.chains.iter().find(|d| d.name == r.chain) else {
            continue; // its chain is being deleted
        };
        let wanted = r.comment.as_deref().filter(|c| {
            desired
                .rules
                .iter()
                .any(|d| d.chain == chain.name && d.id == *c)
        });
        match wanted {
            Some(id) if present.insert((chain.name, id)) => {}
            _ => {
                // Not ours, stale, or a duplicate left by an earlier run.
                let _ = writeln!(
                    script,
                    "delete rule inet {t} {} handle {}",
                    r.chain, r.handle
                );
                changed = true;
            }
        }
    }
    for d in &desired.rules {
        if !present.contains(&(d.chain, d.id.as_str())) {
            let _ = writeln!(
                script,
                "add rule inet {t} {} {} comment \"{}\"",
                d.chain, d.body, d.id
            );
            changed = true;
        }
    }
    changed.then_some(script)
}

async fn nft(args: &[&str], stdin: Option<&str>) -> Result<String, NftError> {
    let joined = args.join(" ");
    let mut child = tokio::process::Command::new("nft")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| NftError::Spawn {
            args: joined.clone(),
            source,
        })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .await
            .map_err(|source| NftError::Spawn {
                args: joined.clone(),
                source,
            })?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|source| NftError::Spawn {
            args: joined.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(NftError::Failed {
            args: joined,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Reads the table from the kernel; `None` when it does not exist.
pub async fn read_table(table: &str) -> Result<Option<CurrentTable>, NftError> {
    match nft(&["-j", "list", "table", "inet", table], None).await {
        Ok(json) => parse_listing(&json).map(Some),
        Err(NftError::Failed { stderr, .. }) if stderr.contains("No such file or directory") => {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Brings the kernel's table to `desired` in one atomic transaction.
/// Returns whether anything had to change.
pub async fn apply(desired: &Ruleset) -> Result<bool, NftError> {
    let current = read_table(&desired.table).await?;
    match reconcile_script(desired, current.as_ref()) {
        None => Ok(false),
        Some(script) => {
            tracing::debug!(%script, "applying nftables changes");
            nft(&["-f", "-"], Some(&script)).await?;
            Ok(true)
        }
    }
}

/// Removes the table (on orderly shutdown); a missing table is not an error.
pub async fn delete_table(table: &str) -> Result<(), NftError> {
    match nft(&["delete", "table", "inet", table], None).await {
        Err(NftError::Failed { stderr, .. }) if stderr.contains("No such file or directory") => {
            Ok(())
        }
        other => other.map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tandem_core::nat::{ClusterPrefixes, NatPlanInput};

    fn plan(peer_pod: &str) -> NatPlan {
        let p = |pod: &str, ext: &str| ClusterPrefixes {
            pod_cidr: pod.parse().unwrap(),
            external_cidr: ext.parse().unwrap(),
        };
        NatPlan::build(&NatPlanInput {
            local: p("10.244.0.0/16", "10.70.0.0/16"),
            local_as_seen_by_peer: p("10.0.0.0/16", "10.1.0.0/16"),
            peer_as_seen_locally: p(peer_pod, "10.3.0.0/16"),
        })
        .unwrap()
    }

    /// What the kernel would list after applying `rs` (handles from 10 on).
    fn as_current(rs: &Ruleset) -> CurrentTable {
        CurrentTable {
            chains: rs
                .chains
                .iter()
                .map(|c| CurrentChain {
                    name: c.name.into(),
                    base: Some((c.kind.into(), c.hook.into(), c.priority)),
                })
                .collect(),
            rules: rs
                .rules
                .iter()
                .enumerate()
                .map(|(i, r)| CurrentRule {
                    chain: r.chain.into(),
                    handle: 10 + i as u64,
                    comment: Some(r.id.clone()),
                })
                .collect(),
        }
    }

    #[test]
    fn render_double_nat() {
        let rs = render(&plan("10.2.0.0/16"), "tandem_t", "tdm0", 1420, None);
        let bodies: Vec<&str> = rs.rules.iter().map(|r| r.body.as_str()).collect();
        assert_eq!(
            bodies,
            vec![
                "iifname \"tdm0\" ip daddr 10.0.0.0/16 dnat ip prefix to 10.244.0.0/16",
                "iifname \"tdm0\" ip daddr 10.1.0.0/16 dnat ip prefix to 10.70.0.0/16",
                "oifname \"tdm0\" ip saddr 10.244.0.0/16 snat ip prefix to 10.0.0.0/16",
                "oifname \"tdm0\" meta nfproto ipv4 ip saddr != { 10.244.0.0/16 } snat ip to 10.1.0.0",
                "oifname \"tdm0\" tcp flags syn / syn,rst tcp option maxseg size set rt mtu",
                "iifname \"tdm0\" meta nfproto ipv4 tcp flags syn / syn,rst tcp option maxseg size set 1380",
                "iifname \"tdm0\" meta nfproto ipv6 tcp flags syn / syn,rst tcp option maxseg size set 1360",
            ]
        );
        let ids: BTreeSet<&str> = rs.rules.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids.len(), rs.rules.len(), "ids are unique");
    }

    #[test]
    fn least_exposure_drops_new_connections_to_anything_not_allowed() {
        let allowed: Vec<IpNet> = vec!["10.244.1.7/32".parse().unwrap()];
        let rs = render(&plan("10.2.0.0/16"), "t", "tdm0", 1420, Some(&allowed));
        let bodies: Vec<&str> = rs
            .rules
            .iter()
            .filter(|r| r.chain.starts_with("expose"))
            .map(|r| r.body.as_str())
            .collect();
        assert_eq!(
            bodies,
            vec![
                "iifname \"tdm0\" meta nfproto ipv4 ct state != { established, related } ip daddr != { 10.244.1.7/32 } drop",
                "iifname \"tdm0\" meta nfproto ipv6 ct state != { established, related } drop",
                "iifname \"tdm0\" ct state != { established, related } drop",
            ]
        );
        assert!(rs.chains.iter().any(|c| c.hook == "input"));
        // A pod more changes one rule; the others stay.
        let more: Vec<IpNet> = vec![allowed[0], "10.244.2.9/32".parse().unwrap()];
        let next = render(&plan("10.2.0.0/16"), "t", "tdm0", 1420, Some(&more));
        let script = reconcile_script(&next, Some(&as_current(&rs))).expect("a change");
        assert_eq!(script.matches("add rule").count(), 1, "{script}");
        // Without an allow-list: no filter chains at all.
        let open = render(&plan("10.2.0.0/16"), "t", "tdm0", 1420, None);
        assert!(open.rules.iter().all(|r| !r.chain.starts_with("expose")));
    }

    #[test]
    fn reconcile_table() {
        let desired = render(&plan("10.2.0.0/16"), "t", "tdm0", 1420, None);
        let applied = as_current(&desired);
        let changed_plan = render(&plan("10.4.0.0/16"), "t", "tdm0", 1420, None);

        let mut duplicated = applied.clone();
        duplicated.rules.push(CurrentRule {
            handle: 99,
            ..applied.rules[0].clone()
        });
        let mut foreign = applied.clone();
        foreign.rules.push(CurrentRule {
            chain: "nat_out".into(),
            handle: 77,
            comment: None,
        });
        foreign.chains.push(CurrentChain {
            name: "leftover".into(),
            base: None,
        });
        let mut wrong_hook = applied.clone();
        wrong_hook.chains[2].base = Some(("filter".into(), "input".into(), 0));

        type Case<'a> = (
            &'a str,
            &'a Ruleset,
            Option<&'a CurrentTable>,
            Option<Vec<&'a str>>,
        );
        let cases: Vec<Case> = vec![
            (
                "same plan applied again changes nothing",
                &desired,
                Some(&applied),
                None,
            ),
            (
                "empty kernel gets table, chains and all rules",
                &desired,
                None,
                Some(vec!["add table", "add chain", "add chain", "add chain"]).map(|mut v| {
                    v.extend(std::iter::repeat_n("add rule", desired.rules.len()));
                    v
                }),
            ),
            (
                "duplicate from a crashed run is deleted",
                &desired,
                Some(&duplicated),
                Some(vec!["add table", "delete rule inet t nat_in handle 99"]),
            ),
            (
                "foreign rule and chain are removed",
                &desired,
                Some(&foreign),
                Some(vec![
                    "add table",
                    "flush chain inet t leftover",
                    "delete chain inet t leftover",
                    "delete rule inet t nat_out handle 77",
                ]),
            ),
        ];
        for (name, want_rs, cur, want) in cases {
            let got = reconcile_script(want_rs, cur);
            let got_lines: Option<Vec<String>> =
                got.map(|s| s.lines().map(str::to_string).collect());
            match (got_lines, want) {
                (None, None) => {}
                (Some(lines), Some(prefixes)) => {
                    assert_eq!(lines.len(), prefixes.len(), "{name}: {lines:#?}");
                    for (l, p) in lines.iter().zip(prefixes) {
                        assert!(l.starts_with(p), "{name}: {l:?} should start with {p:?}");
                    }
                }
                (got, want) => panic!("{name}: got {got:#?}, want {want:#?}"),
            }
        }

        // A changed plan replaces only the rules that differ (here: nothing in nat rules,
        // since the peer's name for its pods only changes routes; so use a different MTU).
        let other_mtu = render(&plan("10.2.0.0/16"), "t", "tdm0", 1380, None);
        let script = reconcile_script(&other_mtu, Some(&applied)).unwrap();
        let deletes = script
            .lines()
            .filter(|l| l.starts_with("delete rule"))
            .count();
        let adds = script.lines().filter(|l| l.starts_with("add rule")).count();
        assert_eq!((deletes, adds), (2, 2), "{script}");
        assert!(reconcile_script(&changed_plan, Some(&applied)).is_none());

        // A hook change recreates the chain with its rules.
        let script = reconcile_script(&desired, Some(&wrong_hook)).unwrap();
        assert!(script.contains("delete chain inet t mss_clamp"), "{script}");
        assert!(script.contains("add chain inet t mss_clamp"), "{script}");
        assert_eq!(
            script
                .lines()
                .filter(|l| l.starts_with("add rule inet t mss_clamp"))
                .count(),
            3
        );
    }

    #[test]
    fn parse_kernel_listing() {
        let json = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
          {"table": {"family": "inet", "name": "t", "handle": 1}},
          {"chain": {"family": "inet", "table": "t", "name": "nat_in", "handle": 1, "type": "nat", "hook": "prerouting", "prio": -100, "policy": "accept"}},
          {"chain": {"family": "inet", "table": "t", "name": "plain", "handle": 2}},
          {"rule": {"family": "inet", "table": "t", "chain": "nat_in", "handle": 4, "comment": "tandem:ab", "expr": []}},
          {"rule": {"family": "inet", "table": "t", "chain": "nat_in", "handle": 5, "expr": []}}]}"#;
        let t = parse_listing(json).unwrap();
        assert_eq!(
            t.chains[0].base,
            Some(("nat".into(), "prerouting".into(), -100))
        );
        assert_eq!(t.chains[1].base, None);
        assert_eq!(t.rules.len(), 2);
        assert_eq!(t.rules[0].comment.as_deref(), Some("tandem:ab"));
        assert_eq!(t.rules[1].handle, 5);
    }
}
