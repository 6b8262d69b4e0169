//! A CronJob runs its schedule: a `* * * * *` CronJob whose last run was minutes ago (as after
//! a controller outage) starts the most recent run at once, records it in its status, sees it
//! complete and prunes it beyond its history limit. The test plays the kubelet.

use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::common::{Cluster, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_minute_cronjob_creates_a_job_records_it_and_prunes_history() {
    let cluster = Cluster::start().await;
    cluster.namespace("cron").await;
    let client = &cluster.client;
    let cronjobs = Api::<CronJob>::namespaced(client.clone(), "cron");
    let jobs = Api::<Job>::namespaced(client.clone(), "cron");
    let pods = Api::<Pod>::namespaced(client.clone(), "cron");
    // The job template carries a selector, as the API server's Job defaults would add.
    let cj: CronJob = serde_json::from_value(json!({
        "metadata": {"name": "tick"},
        "spec": {
            "schedule": "* * * * *",
            "concurrencyPolicy": "Forbid",
            "successfulJobsHistoryLimit": 0,
            "jobTemplate": {
                "metadata": {"labels": {"app": "tick"}},
                "spec": {
                    "backoffLimit": 1,
                    "manualSelector": true,
                    "selector": {"matchLabels": {"app": "tick"}},
                    "template": {
                        "metadata": {"labels": {"app": "tick"}},
                        "spec": {"restartPolicy": "Never",
                                 "containers": [{"name": "main", "image": "busybox"}]},
                    },
                },
            },
        },
    }))
    .unwrap();
    cronjobs.create(&PostParams::default(), &cj).await.unwrap();
    // Its last run three minutes ago: the most recent missed time runs now, not in a minute.
    let last = Timestamp::now() - SignedDuration::from_secs(180);
    cronjobs
        .patch_status(
            "tick",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"lastScheduleTime": last.to_string()}})),
        )
        .await
        .unwrap();

    let job = eventually("a job for the latest minute", || async {
        jobs.list(&ListParams::default()).await.unwrap().items.pop()
    })
    .await;
    let scheduled: Timestamp = job.annotations()["batch.kubernetes.io/cronjob-scheduled-timestamp"]
        .parse()
        .unwrap();
    assert_eq!(
        job.name_any(),
        format!("tick-{}", scheduled.as_second() / 60)
    );
    assert!(scheduled > last && scheduled <= Timestamp::now());
    let owner = &job.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.controller),
        ("CronJob", Some(true))
    );
    let status = eventually("the job listed as active", || async {
        let s = cronjobs.get("tick").await.unwrap().status?;
        (s.active.as_ref()?.len() == 1).then_some(s)
    })
    .await;
    assert_eq!(status.last_schedule_time.unwrap().0, scheduled);

    // The job's pod succeeds: the job completes, leaves the active list, and with a
    // history limit of 0 is deleted.
    let pod = eventually("the job's pod", || async {
        pods.list(&ListParams::default()).await.unwrap().items.pop()
    })
    .await;
    let now = Timestamp::now().to_string();
    pods.patch_status(
        &pod.name_any(),
        &PatchParams::default(),
        &Patch::Merge(
            json!({"status": {"phase": "Succeeded", "containerStatuses": [
            {"name": "main", "image": "busybox", "imageID": "", "ready": false, "restartCount": 0,
             "state": {"terminated": {"exitCode": 0, "finishedAt": now}}}]}}),
        ),
    )
    .await
    .unwrap();
    // (A later minute may start another run meanwhile: only this one is looked at.)
    let status = eventually("the run recorded as successful", || async {
        let s = cronjobs.get("tick").await.unwrap().status?;
        let listed = s.active.iter().flatten().any(|r| r.uid == job.metadata.uid);
        (!listed && s.last_successful_time.is_some()).then_some(s)
    })
    .await;
    assert!(status.last_successful_time.unwrap().0 >= scheduled);
    eventually("the completed job pruned", || async {
        let left = jobs.list(&ListParams::default()).await.unwrap().items;
        left.iter()
            .all(|j| j.name_any() != job.name_any() || j.metadata.deletion_timestamp.is_some())
            .then_some(())
    })
    .await;
}
