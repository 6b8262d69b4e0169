//! The last two samples of every node and container scraped, and the usage between them, as
//! metrics-server's storage keeps them: CPU is the rate of the cumulative counter between the
//! two samples, memory the last working set, and nothing is reported until there are two. A
//! container that restarted (another start time) or whose counter went back starts over.

use std::collections::BTreeMap;
use std::time::Duration;

use super::decode::{Batch, ContainerPoint, PodKey, Point};

/// metrics-server's default `--metric-resolution`: how often kubelets are scraped.
pub const DEFAULT_RESOLUTION: Duration = Duration::from_secs(15);

/// Usage over one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Time of the last sample, ms since the epoch.
    pub at_ms: i64,
    /// Time between the two samples, ms.
    pub window_ms: i64,
    /// CPU, in billionths of a core.
    pub nanocores: u64,
    /// Working set at the last sample, bytes.
    pub memory: u64,
}

/// The last sample of one counter and the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Series {
    prev: Option<Point>,
    last: Point,
    start_ms: Option<i64>,
}

impl Series {
    /// `old` followed by `new`.
    fn after(old: Option<&Series>, new: Point, start_ms: Option<i64>) -> Series {
        match old {
            // The kubelet served the sample already seen (its stats are cached): nothing new.
            Some(old) if old.start_ms == start_ms && new.at_ms <= old.last.at_ms => *old,
            Some(old) if old.start_ms == start_ms && new.cpu_ns >= old.last.cpu_ns => Series {
                prev: Some(old.last),
                last: new,
                start_ms,
            },
            _ => Series {
                prev: None,
                last: new,
                start_ms,
            },
        }
    }

    fn usage(&self) -> Option<Usage> {
        let prev = self.prev?;
        let window_ms = self.last.at_ms - prev.at_ms;
        if window_ms <= 0 {
            return None;
        }
        // ns of CPU per ms of wall time, times 1000: billionths of a core.
        let used = u128::from(self.last.cpu_ns - prev.cpu_ns);
        let nanocores = u64::try_from(used * 1000 / window_ms as u128).unwrap_or(u64::MAX);
        Some(Usage {
            at_ms: self.last.at_ms,
            window_ms,
            nanocores,
            memory: self.last.memory,
        })
    }
}

/// A pod's usage: when, over what window, and each container's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodUsage {
    /// Time of the newest container sample, ms since the epoch.
    pub at_ms: i64,
    /// Its window, ms.
    pub window_ms: i64,
    /// Container name and usage, by name.
    pub containers: Vec<(String, Usage)>,
}

/// Every node's and pod's last two samples.
#[derive(Debug, Default)]
pub struct Window {
    nodes: BTreeMap<String, Series>,
    pods: BTreeMap<PodKey, BTreeMap<String, Series>>,
}

impl Window {
    /// Takes one round of scrapes, a batch per node that answered: a node that failed or is
    /// gone drops out with its pods, as metrics-server replaces its whole store each round.
    pub fn store(&mut self, round: Vec<(String, Batch)>) {
        let mut nodes = BTreeMap::new();
        let mut pods = BTreeMap::new();
        for (node, batch) in round {
            if let Some(point) = batch.node {
                let series = Series::after(self.nodes.get(&node), point, None);
                nodes.insert(node, series);
            }
            for (key, containers) in batch.pods {
                let old = self.pods.get(&key);
                let series = containers
                    .into_iter()
                    .map(|(name, ContainerPoint { point, start_ms })| {
                        let old = old.and_then(|o| o.get(&name));
                        let series = Series::after(old, point, start_ms);
                        (name, series)
                    })
                    .collect();
                pods.insert(key, series);
            }
        }
        self.nodes = nodes;
        self.pods = pods;
    }

    /// Node `name`'s usage, once it has two samples.
    pub fn node(&self, name: &str) -> Option<Usage> {
        self.nodes.get(name)?.usage()
    }

    /// Pod `namespace/name`'s usage, once each of its containers has two samples.
    pub fn pod(&self, namespace: &str, name: &str) -> Option<PodUsage> {
        let containers = self.pods.get(&(namespace.to_string(), name.to_string()))?;
        let containers: Vec<(String, Usage)> = containers
            .iter()
            .map(|(c, s)| Some((c.clone(), s.usage()?)))
            .collect::<Option<_>>()?;
        let newest = containers.iter().map(|(_, u)| u).max_by_key(|u| u.at_ms)?;
        Some(PodUsage {
            at_ms: newest.at_ms,
            window_ms: newest.window_ms,
            containers,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(at_ms: i64, cpu_ms: u64, memory: u64) -> Point {
        Point {
            at_ms,
            cpu_ns: cpu_ms * 1_000_000,
            memory,
        }
    }

    fn batch(node: Option<Point>, containers: &[(&str, &str, Point, i64)]) -> Batch {
        let mut b = Batch {
            node,
            ..Default::default()
        };
        for (pod, container, point, start_ms) in containers {
            b.pods
                .entry(("demo".to_string(), pod.to_string()))
                .or_default()
                .insert(
                    container.to_string(),
                    ContainerPoint {
                        point: *point,
                        start_ms: Some(*start_ms),
                    },
                );
        }
        b
    }

    #[test]
    fn usage_is_the_rate_between_the_last_two_samples() {
        let mut w = Window::default();
        w.store(vec![(
            "n1".into(),
            batch(
                Some(point(10_000, 5_000, 900)),
                &[("web", "app", point(10_000, 200, 64), 1)],
            ),
        )]);
        assert_eq!(w.node("n1"), None, "one sample is not enough");
        assert_eq!(w.pod("demo", "web"), None);
        w.store(vec![(
            "n1".into(),
            batch(
                Some(point(25_000, 12_500, 1000)),
                &[("web", "app", point(25_000, 350, 80), 1)],
            ),
        )]);
        // 7.5 s of CPU in 15 s: half a core; 150 ms in 15 s: 10 millicores.
        assert_eq!(
            w.node("n1"),
            Some(Usage {
                at_ms: 25_000,
                window_ms: 15_000,
                nanocores: 500_000_000,
                memory: 1000
            })
        );
        let pod = w.pod("demo", "web").unwrap();
        assert_eq!((pod.at_ms, pod.window_ms), (25_000, 15_000));
        assert_eq!(
            pod.containers,
            vec![(
                "app".to_string(),
                Usage {
                    at_ms: 25_000,
                    window_ms: 15_000,
                    nanocores: 10_000_000,
                    memory: 80
                }
            )]
        );
    }

    #[test]
    fn restarts_resets_repeats_and_failed_nodes() {
        let mut w = Window::default();
        let two = |w: &mut Window, first: Batch, second: Batch| {
            w.store(vec![("n1".into(), first)]);
            w.store(vec![("n1".into(), second)]);
        };
        // A restarted container (new start time) starts over, even if its counter grew.
        two(
            &mut w,
            batch(None, &[("web", "app", point(1_000, 10, 1), 1)]),
            batch(None, &[("web", "app", point(2_000, 20, 1), 2)]),
        );
        assert_eq!(w.pod("demo", "web"), None);
        // So does a counter that went back.
        w.store(vec![(
            "n1".into(),
            batch(None, &[("web", "app", point(3_000, 5, 1), 2)]),
        )]);
        assert_eq!(w.pod("demo", "web"), None);
        // The same sample served twice changes nothing.
        w.store(vec![(
            "n1".into(),
            batch(None, &[("web", "app", point(3_000, 5, 1), 2)]),
        )]);
        assert_eq!(w.pod("demo", "web"), None);
        w.store(vec![(
            "n1".into(),
            batch(None, &[("web", "app", point(4_000, 6, 1), 2)]),
        )]);
        assert_eq!(
            w.pod("demo", "web").unwrap().containers[0].1.nanocores,
            1_000_000
        );
        // A pod is shown only when every container has two samples.
        w.store(vec![(
            "n1".into(),
            batch(
                None,
                &[
                    ("web", "app", point(5_000, 7, 1), 2),
                    ("web", "sidecar", point(5_000, 1, 1), 1),
                ],
            ),
        )]);
        assert_eq!(w.pod("demo", "web"), None);
        // A node that did not answer drops out with its pods.
        w.store(vec![]);
        w.store(vec![(
            "n1".into(),
            batch(None, &[("web", "app", point(6_000, 8, 1), 2)]),
        )]);
        assert_eq!(w.pod("demo", "web"), None);
    }
}
