//! Cluster DNS as pods see it (no root needed: the server runs on loopback here): Service,
//! headless and SRV records from the API objects, NXDOMAIN inside the zone, other names refused
//! until the Corefile in `kube-system/coredns` forwards them, over UDP and TCP.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use tandem_lab::network::{ServiceView, dns};
use tandem_testing::until;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn query(name: &str, kind: RecordType) -> Message {
    let mut m = Message::new();
    m.set_id(4242)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
    m
}

async fn ask_udp(server: SocketAddr, name: &str, kind: RecordType) -> Message {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket
        .send_to(&query(name, kind).to_vec().unwrap(), server)
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    Message::from_vec(&buf[..n]).unwrap()
}

async fn ask_tcp(server: SocketAddr, name: &str, kind: RecordType) -> Message {
    let mut stream = tokio::net::TcpStream::connect(server).await.unwrap();
    let bytes = query(name, kind).to_vec().unwrap();
    stream.write_u16(bytes.len() as u16).await.unwrap();
    stream.write_all(&bytes).await.unwrap();
    let len = stream.read_u16().await.unwrap();
    let mut buf = vec![0u8; len as usize];
    stream.read_exact(&mut buf).await.unwrap();
    Message::from_vec(&buf).unwrap()
}

fn addresses(m: &Message) -> Vec<Ipv4Addr> {
    m.answers()
        .iter()
        .filter_map(|r| match r.data() {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

/// A stand-in upstream that answers every A query with 192.0.2.7.
async fn upstream() -> SocketAddr {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let Ok(q) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut r = Message::new();
            r.set_id(q.id()).set_message_type(MessageType::Response);
            for query in q.queries() {
                r.add_query(query.clone());
                r.add_answer(Record::from_rdata(
                    query.name().clone(),
                    5,
                    RData::A(A(Ipv4Addr::new(192, 0, 2, 7))),
                ));
            }
            let _ = socket.send_to(&r.to_vec().unwrap(), peer).await;
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_dns_answers_the_cluster_zone_and_forwards_only_what_the_corefile_says() {
    let server = tandem_apiserver::ApiServer::start(Default::default())
        .await
        .unwrap();
    let client = server.client().await.unwrap();
    let (view, _watch) = ServiceView::start(client.clone()).await.unwrap();
    let zone = dns::Zone::new(view, None);
    let (udp, tcp) = tandem_dns::bind("127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let addr = udp.local_addr().unwrap();
    tokio::spawn(dns::follow_config(client.clone(), zone.clone()));
    tokio::spawn(dns::serve(zone, udp, tcp));

    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "demo"}})).unwrap(),
        )
        .await
        .unwrap();
    let services = Api::<Service>::namespaced(client.clone(), "demo");
    for svc in [
        json!({"metadata": {"name": "hello"}, "spec": {"ports": [{"name": "http", "port": 80}]}}),
        json!({"metadata": {"name": "db"}, "spec": {"clusterIP": "None", "ports": [{"port": 5432}]}}),
    ] {
        services
            .create(
                &PostParams::default(),
                &serde_json::from_value(svc).unwrap(),
            )
            .await
            .unwrap();
    }
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "db-1", "labels": {"kubernetes.io/service-name": "db"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.244.1.5"], "hostname": "db-0", "conditions": {"ready": true}},
                      {"addresses": ["10.244.2.5"], "hostname": "db-1", "conditions": {"ready": true}}],
        "ports": [{"port": 5432}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(client.clone(), "demo")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
    let cluster_ip: Ipv4Addr = services
        .get("hello")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap()
        .parse()
        .unwrap();

    let hello = until(
        "the new Service resolving",
        Duration::from_secs(10),
        || async {
            let m = ask_udp(addr, "hello.demo.svc.cluster.local.", RecordType::A).await;
            (!m.answers().is_empty()).then_some(m)
        },
    )
    .await;
    assert_eq!(addresses(&hello), vec![cluster_ip]);
    assert!(hello.authoritative());
    let tcp = ask_tcp(addr, "hello.demo.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addresses(&tcp), vec![cluster_ip], "TCP answers too");

    let db = until(
        "the headless Service's endpoints",
        Duration::from_secs(10),
        || async {
            let m = ask_udp(addr, "db.demo.svc.cluster.local.", RecordType::A).await;
            (addresses(&m).len() == 2).then_some(m)
        },
    )
    .await;
    let mut ips = addresses(&db);
    ips.sort();
    assert_eq!(
        ips,
        vec![Ipv4Addr::new(10, 244, 1, 5), Ipv4Addr::new(10, 244, 2, 5)]
    );
    let one = ask_udp(addr, "db-1.db.demo.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addresses(&one), vec![Ipv4Addr::new(10, 244, 2, 5)]);

    let srv = ask_udp(
        addr,
        "_http._tcp.hello.demo.svc.cluster.local.",
        RecordType::SRV,
    )
    .await;
    let RData::SRV(record) = srv.answers()[0].data() else {
        panic!("an SRV answer: {srv:?}")
    };
    assert_eq!(record.port(), 80);
    assert_eq!(record.target().to_ascii(), "hello.demo.svc.cluster.local.");

    let missing = ask_udp(addr, "nope.demo.svc.cluster.local.", RecordType::A).await;
    assert_eq!(missing.response_code(), ResponseCode::NXDomain);
    let outside = ask_udp(addr, "example.org.", RecordType::A).await;
    assert_eq!(
        outside.response_code(),
        ResponseCode::Refused,
        "nothing leaves by default"
    );

    // The lab default Corefile appears; a stub domain added to it forwards that zone only.
    let configs = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let corefile = until("the default Corefile", Duration::from_secs(10), || async {
        configs
            .get_opt("coredns")
            .await
            .ok()??
            .data?
            .remove("Corefile")
    })
    .await;
    let up = upstream().await;
    let edited = format!("{corefile}example.org:53 {{\n    forward . {up}\n}}\n");
    configs
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"Corefile": edited}})),
        )
        .await
        .unwrap();
    let forwarded = until(
        "example.org forwarded to its stub server",
        Duration::from_secs(10),
        || async {
            let m = ask_udp(addr, "www.example.org.", RecordType::A).await;
            (m.response_code() == ResponseCode::NoError).then_some(m)
        },
    )
    .await;
    assert_eq!(addresses(&forwarded), vec![Ipv4Addr::new(192, 0, 2, 7)]);
    let other = ask_udp(addr, "example.net.", RecordType::A).await;
    assert_eq!(
        other.response_code(),
        ResponseCode::Refused,
        "only the stub's zone goes out"
    );

    // A broken Corefile keeps the last good configuration.
    configs
        .patch(
            "coredns",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"data": {"Corefile": "example.org:53 {\n forward . not-an-ip\n}\n"}}),
            ),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let still = ask_udp(addr, "www.example.org.", RecordType::A).await;
    assert_eq!(addresses(&still), vec![Ipv4Addr::new(192, 0, 2, 7)]);
}
