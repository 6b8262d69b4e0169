//! Every namespace gets a `default` ServiceAccount, and keeps it.

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, DeleteParams};

use super::common::{Cluster, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_namespace_gets_a_default_serviceaccount_back_after_deletion() {
    let cluster = Cluster::start().await;
    cluster.namespace("team-sa").await;
    let api = Api::<ServiceAccount>::namespaced(cluster.client.clone(), "team-sa");
    let first = eventually("default serviceaccount in team-sa", || async {
        api.get_opt("default").await.unwrap()
    })
    .await;
    api.delete("default", &DeleteParams::default())
        .await
        .unwrap();
    eventually("default serviceaccount recreated", || async {
        api.get_opt("default")
            .await
            .unwrap()
            .filter(|sa| sa.metadata.uid != first.metadata.uid)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lab_cluster_runs_the_controllers() {
    let lab = tandem_lab::LabCluster::start(tandem_lab::LabConfig::default())
        .await
        .expect("lab cluster starts");
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "team-lab"}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(lab.client.clone())
        .create(&Default::default(), &ns)
        .await
        .unwrap();
    let api = Api::<ServiceAccount>::namespaced(lab.client.clone(), "team-lab");
    eventually("default serviceaccount in team-lab", || async {
        api.get_opt("default").await.unwrap()
    })
    .await;
    lab.shutdown();
}
