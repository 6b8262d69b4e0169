//! Jobs run to completion or stop at their backoff limit; finished pods are counted once,
//! even when they are deleted before the controller sees them. The test plays the kubelet:
//! it moves pods to Succeeded or Failed.

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::common::{Cluster, eventually};

const TRACKING: &str = "batch.kubernetes.io/job-tracking";

/// A Job with the selector and labels the API server's defaults would give it.
fn job(name: &str, uid_label: &str, spec: Value) -> Job {
    let labels = json!({
        "batch.kubernetes.io/controller-uid": uid_label,
        "batch.kubernetes.io/job-name": name,
        "controller-uid": uid_label,
        "job-name": name,
    });
    let mut spec = spec;
    spec["manualSelector"] = json!(true);
    spec["selector"] = json!({"matchLabels": {"batch.kubernetes.io/controller-uid": uid_label}});
    spec["template"] = json!({
        "metadata": {"labels": labels},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "busybox"}]},
    });
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

async fn finish(pods: &Api<Pod>, name: &str, phase: &str, code: i32) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = json!({"status": {
        "phase": phase,
        "conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now}],
        "containerStatuses": [{"name": "main", "image": "busybox", "imageID": "", "ready": false,
            "restartCount": 0, "state": {"terminated": {"exitCode": code, "finishedAt": now}}}],
    }});
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap_or_else(|e| panic!("pod {name}: finishing: {e}"));
}

fn running(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && !matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        )
}

fn condition(job: &Job, type_: &str) -> Option<(String, String)> {
    let c = job
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_ && c.status == "True")?;
    Some((type_.to_string(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_of_five_completions_two_at_a_time_completes_with_five_succeeded() {
    let cluster = Cluster::start().await;
    cluster.namespace("batch").await;
    let client = &cluster.client;
    let jobs = Api::<Job>::namespaced(client.clone(), "batch");
    let pods = Api::<Pod>::namespaced(client.clone(), "batch");
    let spec = json!({"completions": 5, "parallelism": 2, "backoffLimit": 6});
    jobs.create(&PostParams::default(), &job("count", "u-count", spec))
        .await
        .unwrap();

    let mut finished = 0;
    let mut deleted_one = false;
    while finished < 5 {
        let live = eventually("the job's running pods", || async {
            let list = pods.list(&ListParams::default()).await.unwrap().items;
            let live: Vec<Pod> = list.into_iter().filter(running).collect();
            (!live.is_empty()).then_some(live)
        })
        .await;
        assert!(live.len() <= 2, "parallelism 2, saw {} pods", live.len());
        let pod = &live[0];
        assert!(pod.name_any().starts_with("count-"), "{}", pod.name_any());
        assert!(pod.finalizers().iter().any(|f| f == TRACKING));
        let owner = &pod.owner_references()[0];
        assert_eq!((owner.kind.as_str(), owner.controller), ("Job", Some(true)));
        finish(&pods, &pod.name_any(), "Succeeded", 0).await;
        if !deleted_one {
            // A succeeded pod deleted at once (as a provider might) still counts once.
            pods.delete(&pod.name_any(), &DeleteParams::default())
                .await
                .unwrap();
            deleted_one = true;
        }
        finished += 1;
    }
    let done = eventually("the job complete", || async {
        let j = jobs.get("count").await.unwrap();
        condition(&j, "Complete").map(|_| j)
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!(status.succeeded, Some(5), "{status:?}");
    assert_eq!(status.failed.unwrap_or(0), 0);
    assert_eq!(status.active.unwrap_or(0), 0);
    assert!(status.completion_time.is_some() && status.start_time.is_some());
    assert!(condition(&done_again(&jobs).await, "SuccessCriteriaMet").is_some());
    // Counted pods lose the finalizer; the deleted one is gone.
    let left = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(left.len(), 4, "{:?}", names(&left));
    assert!(
        left.iter()
            .all(|p| !p.finalizers().iter().any(|f| f == TRACKING))
    );
}

async fn done_again(jobs: &Api<Job>) -> Job {
    jobs.get("count").await.unwrap()
}

fn names(pods: &[Pod]) -> Vec<String> {
    pods.iter().map(|p| p.name_any()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_job_stops_at_its_backoff_limit() {
    let cluster = Cluster::start().await;
    cluster.namespace("batch").await;
    let client = &cluster.client;
    let jobs = Api::<Job>::namespaced(client.clone(), "batch");
    let pods = Api::<Pod>::namespaced(client.clone(), "batch");
    let spec = json!({"completions": 3, "parallelism": 1, "backoffLimit": 2});
    jobs.create(&PostParams::default(), &job("flaky", "u-flaky", spec))
        .await
        .unwrap();
    // Three failures exceed backoffLimit 2; each replacement comes after the back-off.
    for n in 1..=3 {
        let pod = eventually(&format!("pod {n}"), || async {
            let list = pods.list(&ListParams::default()).await.unwrap().items;
            list.into_iter().find(running)
        })
        .await;
        finish(&pods, &pod.name_any(), "Failed", 1).await;
    }
    let failed = eventually("the job failed", || async {
        let j = jobs.get("flaky").await.unwrap();
        condition(&j, "Failed").map(|_| j)
    })
    .await;
    assert_eq!(
        condition(&failed, "Failed").unwrap().1,
        "BackoffLimitExceeded"
    );
    assert_eq!(
        condition(&failed, "FailureTarget").unwrap().1,
        "BackoffLimitExceeded"
    );
    let status = failed.status.unwrap();
    assert_eq!(status.failed, Some(3));
    assert_eq!(status.succeeded.unwrap_or(0), 0);
    assert!(status.completion_time.is_none());
    let all = pods.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(all.len(), 3, "no pod after the limit: {:?}", names(&all));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn indexed_job_gives_each_pod_its_index_and_reports_completed_indexes() {
    let cluster = Cluster::start().await;
    cluster.namespace("batch").await;
    let client = &cluster.client;
    let jobs = Api::<Job>::namespaced(client.clone(), "batch");
    let pods = Api::<Pod>::namespaced(client.clone(), "batch");
    let spec = json!({"completions": 3, "parallelism": 3, "backoffLimit": 1,
                      "completionMode": "Indexed"});
    jobs.create(&PostParams::default(), &job("idx", "u-idx", spec))
        .await
        .unwrap();
    let live = eventually("three indexed pods", || async {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        (list.len() == 3).then_some(list)
    })
    .await;
    let mut indexes: Vec<String> = Vec::new();
    for pod in &live {
        let index = pod.annotations()[COMPLETION_INDEX].clone();
        assert_eq!(pod.labels()[COMPLETION_INDEX], index);
        assert!(
            pod.name_any().starts_with(&format!("idx-{index}-")),
            "{}",
            pod.name_any()
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(
            spec.hostname.as_deref(),
            Some(format!("idx-{index}").as_str())
        );
        let env = spec.containers[0].env.as_ref().unwrap();
        assert!(env.iter().any(|e| e.name == "JOB_COMPLETION_INDEX"));
        indexes.push(index);
    }
    indexes.sort();
    assert_eq!(indexes, ["0", "1", "2"]);
    for pod in &live {
        if pod.annotations()[COMPLETION_INDEX] != "1" {
            finish(&pods, &pod.name_any(), "Succeeded", 0).await;
        }
    }
    let status = eventually("indexes 0 and 2 completed", || async {
        let s = jobs.get("idx").await.unwrap().status?;
        (s.completed_indexes.as_deref() == Some("0,2")).then_some(s)
    })
    .await;
    assert_eq!(status.succeeded, Some(2));
    let one = live
        .iter()
        .find(|p| p.annotations()[COMPLETION_INDEX] == "1")
        .unwrap();
    finish(&pods, &one.name_any(), "Succeeded", 0).await;
    let status = eventually("the job complete", || async {
        let j = jobs.get("idx").await.unwrap();
        condition(&j, "Complete").and(j.status)
    })
    .await;
    assert_eq!(status.completed_indexes.as_deref(), Some("0-2"));
    assert_eq!(status.succeeded, Some(3));
}

const COMPLETION_INDEX: &str = "batch.kubernetes.io/job-completion-index";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_jobs_release_their_pods_and_finished_ones_go_after_their_ttl() {
    let cluster = Cluster::start().await;
    cluster.namespace("batch").await;
    let client = &cluster.client;
    let jobs = Api::<Job>::namespaced(client.clone(), "batch");
    let pods = Api::<Pod>::namespaced(client.clone(), "batch");
    let of = |job: &'static str| {
        let pods = pods.clone();
        move || {
            let pods = pods.clone();
            async move {
                let lp =
                    ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}"));
                pods.list(&lp).await.unwrap().items
            }
        }
    };

    // A running Job deleted with its pods: their tracking finalizer must not hold them.
    let spec = json!({"completions": 4, "parallelism": 2, "backoffLimit": 1});
    jobs.create(&PostParams::default(), &job("doomed", "u-doomed", spec))
        .await
        .unwrap();
    let doomed = of("doomed");
    eventually("two running pods", || async {
        (doomed().await.len() == 2).then_some(())
    })
    .await;
    let background = DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Background),
        ..Default::default()
    };
    jobs.delete("doomed", &background).await.unwrap();
    eventually("the pods gone", || async {
        doomed().await.is_empty().then_some(())
    })
    .await;

    // A finished Job with ttlSecondsAfterFinished 2 is deleted two seconds after it completes.
    let spec = json!({"completions": 1, "backoffLimit": 1, "ttlSecondsAfterFinished": 2});
    jobs.create(&PostParams::default(), &job("brief", "u-brief", spec))
        .await
        .unwrap();
    let brief = of("brief");
    let pod = eventually("its pod", || async { brief().await.pop() }).await;
    finish(&pods, &pod.name_any(), "Succeeded", 0).await;
    // (It may be gone before a poll sees it Complete: its Completed event tells.)
    eventually("the job deleted after its TTL", || async {
        jobs.get("brief").await.is_err().then_some(())
    })
    .await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(client.clone(), "batch");
    let list = events.list(&ListParams::default()).await.unwrap().items;
    assert!(
        list.iter().any(|e| e.reason.as_deref() == Some("Completed")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("brief")),
        "it completed before it went"
    );
    eventually("its pod collected", || async {
        brief().await.is_empty().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_past_its_active_deadline_fails_and_its_pods_go() {
    use k8s_openapi::api::events::v1::Event;
    let cluster = Cluster::start().await;
    cluster.namespace("batch").await;
    let client = &cluster.client;
    let jobs = Api::<Job>::namespaced(client.clone(), "batch");
    let pods = Api::<Pod>::namespaced(client.clone(), "batch");
    let spec = json!({"completions": 2, "parallelism": 2, "backoffLimit": 6,
                      "activeDeadlineSeconds": 1});
    jobs.create(&PostParams::default(), &job("slow", "u-slow", spec))
        .await
        .unwrap();
    let failed = eventually("the job failed", || async {
        let j = jobs.get("slow").await.unwrap();
        condition(&j, "Failed").map(|_| j)
    })
    .await;
    assert_eq!(condition(&failed, "Failed").unwrap().1, "DeadlineExceeded");
    let status = failed.status.unwrap();
    assert_eq!(status.failed, Some(2), "the running pods count as failed");
    assert_eq!(status.active.unwrap_or(0), 0);
    eventually("the pods gone", || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    let events = Api::<Event>::namespaced(client.clone(), "batch");
    eventually("a DeadlineExceeded warning", || async {
        let list = events.list(&ListParams::default()).await.unwrap().items;
        list.iter()
            .find(|e| {
                e.reason.as_deref() == Some("DeadlineExceeded")
                    && e.type_.as_deref() == Some("Warning")
            })
            .map(|_| ())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspending_a_job_removes_its_pods_without_counting_them_failed() {
    let cluster = Cluster::start().await;
    cluster.namespace("batch").await;
    let client = &cluster.client;
    let jobs = Api::<Job>::namespaced(client.clone(), "batch");
    let pods = Api::<Pod>::namespaced(client.clone(), "batch");
    let count = || async { pods.list(&ListParams::default()).await.unwrap().items.len() };
    let suspend = |on: bool| {
        let jobs = jobs.clone();
        async move {
            jobs.patch(
                "paused",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"suspend": on}})),
            )
            .await
            .unwrap();
        }
    };
    let spec = json!({"completions": 4, "parallelism": 2, "backoffLimit": 1, "suspend": true});
    jobs.create(&PostParams::default(), &job("paused", "u-paused", spec))
        .await
        .unwrap();
    let suspended = |want: &'static str| {
        let jobs = jobs.clone();
        move || {
            let jobs = jobs.clone();
            async move {
                let j = jobs.get("paused").await.unwrap();
                let c = j
                    .status
                    .as_ref()?
                    .conditions
                    .as_ref()?
                    .iter()
                    .find(|c| c.type_ == "Suspended")?
                    .clone();
                (c.status == want).then_some(j)
            }
        }
    };
    let j = eventually("Suspended True", suspended("True")).await;
    assert!(
        j.status.unwrap().start_time.is_none(),
        "a suspended job has not started"
    );
    assert_eq!(count().await, 0);
    suspend(false).await;
    let j = eventually("Suspended False (resumed)", suspended("False")).await;
    assert!(j.status.unwrap().start_time.is_some());
    eventually("two pods", || async { (count().await == 2).then_some(()) }).await;
    suspend(true).await;
    eventually("pods removed", || async {
        (count().await == 0).then_some(())
    })
    .await;
    let status = eventually("no active pod reported", || async {
        let s = jobs.get("paused").await.unwrap().status?;
        (s.active.unwrap_or(0) == 0).then_some(s)
    })
    .await;
    assert_eq!(status.failed.unwrap_or(0), 0, "suspension is not failure");
}
