//! Where a burst's time goes: when each pod of a burst reaches each stage on its way to Ready
//! (created, bound to a node, Ready; for an offloaded pod also its ShadowPod and real pod in
//! the provider), as watches started before the burst see it. `BENCH_STAGES=1` in the
//! offloading burst prints them under each run.
//!
//! The watches cost the API servers a stream each (an event per change of every pod), vanilla
//! and offloaded alike, so the burst times of a run with stages are not those of a run without.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::watcher;
use tandem_api::ShadowPod;

/// What a watch follows: the pods (or ShadowPods) of one namespace of one cluster.
pub enum Watched {
    Pods,
    ShadowPods,
}

/// One watched place, named in the report (`consumer pods`, `real pods`, ...).
pub struct Place {
    pub label: &'static str,
    pub client: kube::Client,
    pub namespace: String,
    pub what: Watched,
}

/// Each stage of one place (`real pods ready`, ...) and when each object reached it.
type StageTimes = Vec<(String, Vec<Duration>)>;

/// The stage times of one burst, filled by its watches.
pub struct Stages {
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<StageTimes>>,
    stop: tokio::sync::watch::Sender<bool>,
}

/// The stages a pod goes through (a ShadowPod is only created).
const POD_STAGES: [&str; 3] = ["created", "bound", "ready"];

fn pod_stages(pod: &Pod) -> [bool; 3] {
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    let ready = pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    [true, bound, ready]
}

impl Stages {
    /// Starts a watch of each place and waits until each has listed: the burst starts after.
    pub async fn watch(places: Vec<Place>) -> anyhow::Result<Stages> {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let started = Instant::now();
        let mut tasks = Vec::new();
        let mut listed = Vec::new();
        for place in places {
            let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
            listed.push(ready_rx);
            let stopped = stopped.clone();
            tasks.push(tokio::spawn(follow(place, started, ready_tx, stopped)));
        }
        for l in listed {
            tokio::time::timeout(Duration::from_secs(60), l)
                .await
                .map_err(|_| anyhow::anyhow!("stage watches: not listed after 60 s"))?
                .map_err(|_| anyhow::anyhow!("a stage watch ended before listing"))?;
        }
        Ok(Stages {
            started,
            tasks,
            stop,
        })
    }

    /// Stops the watches; the report, in seconds since `burst_started`: for each place and
    /// stage, when the median pod and the last one reached it.
    pub async fn report(self, burst_started: Instant) -> String {
        // Events already sent by the API servers arrive within this.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let _ = self.stop.send(true);
        let offset = burst_started.saturating_duration_since(self.started);
        let mut parts = Vec::new();
        for task in self.tasks {
            let Ok(stages) = task.await else { continue };
            for (name, mut times) in stages {
                if times.is_empty() {
                    continue;
                }
                times.sort();
                let secs = |d: Duration| d.saturating_sub(offset).as_secs_f64();
                parts.push(format!(
                    "{name} {:.2}/{:.2}",
                    secs(times[times.len() / 2]),
                    secs(times[times.len() - 1])
                ));
            }
        }
        format!(
            "  stages (s since the create, median pod / last pod): {}",
            parts.join(", ")
        )
    }
}

/// Follows one place until told to stop; the first time each object was seen at each stage.
async fn follow(
    place: Place,
    started: Instant,
    listed: tokio::sync::oneshot::Sender<()>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> StageTimes {
    let mut listed = Some(listed);
    let mut seen: HashMap<String, [Option<Duration>; 3]> = HashMap::new();
    let mut note = |uid: String, reached: [bool; 3]| {
        let at = started.elapsed();
        let entry = seen.entry(uid).or_default();
        for (i, r) in reached.iter().enumerate() {
            if *r && entry[i].is_none() {
                entry[i] = Some(at);
            }
        }
    };
    let stages: &[&str] = match place.what {
        Watched::Pods => {
            let api: Api<Pod> = Api::namespaced(place.client, &place.namespace);
            drive(api, &mut listed, &mut stop, |p: Pod| {
                note(p.metadata.uid.clone().unwrap_or_default(), pod_stages(&p))
            })
            .await;
            &POD_STAGES
        }
        Watched::ShadowPods => {
            let api: Api<ShadowPod> = Api::namespaced(place.client, &place.namespace);
            drive(api, &mut listed, &mut stop, |s: ShadowPod| {
                note(s.metadata.uid.unwrap_or_default(), [true, false, false])
            })
            .await;
            &POD_STAGES[..1]
        }
    };
    let mut by_stage: BTreeMap<usize, Vec<Duration>> = BTreeMap::new();
    for times in seen.values() {
        for (i, t) in times.iter().enumerate().take(stages.len()) {
            if let Some(t) = t {
                by_stage.entry(i).or_default().push(*t);
            }
        }
    }
    by_stage
        .into_iter()
        .map(|(i, times)| (format!("{} {}", place.label, stages[i]), times))
        .collect()
}

/// Runs a watch of `api` until told to stop, saying when it has listed and handing each object
/// created or changed after that to `apply`.
async fn drive<K>(
    api: Api<K>,
    listed: &mut Option<tokio::sync::oneshot::Sender<()>>,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    mut apply: impl FnMut(K),
) where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = stop.changed() => break,
        };
        match ev {
            Some(Ok(watcher::Event::InitDone)) => {
                if let Some(l) = listed.take() {
                    let _ = l.send(());
                }
            }
            Some(Ok(watcher::Event::Apply(o))) => apply(o),
            Some(_) => {}
            None => break,
        }
    }
}
