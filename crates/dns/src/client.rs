//! A stub resolver for the few lookups Tandem makes itself (DNS-SD browsing of a domain's
//! `_tandem._tcp` records): one question to a recursive server, over UDP and again over TCP
//! when the answer is truncated. hickory-resolver would do it too, but brings a cache, its
//! own runtime glue and the system-configuration parsers for three record types asked once a
//! browse; the messages are hickory-proto's either way.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long one server has to answer one question (each transport).
pub const TIMEOUT: Duration = Duration::from_secs(3);

/// Why a lookup got no answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("no nameserver to ask (none in /etc/resolv.conf; pass one)")]
    NoServer,
    #[error("{server} did not answer {name} {rtype} within {}s", TIMEOUT.as_secs())]
    Timeout {
        server: SocketAddr,
        name: String,
        rtype: RecordType,
    },
    #[error("asking {server} for {name} {rtype}: {source}")]
    Io {
        server: SocketAddr,
        name: String,
        rtype: RecordType,
        #[source]
        source: std::io::Error,
    },
    #[error("{server} answered {name} {rtype} with {code}")]
    Refused {
        server: SocketAddr,
        name: String,
        rtype: RecordType,
        code: ResponseCode,
    },
}

/// The nameservers of a resolv.conf (`nameserver` lines, port 53), in order.
pub fn nameservers(resolv_conf: &str) -> Vec<SocketAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next() == Some("nameserver")).then(|| words.next())?
        })
        .filter_map(|ip| ip.split('%').next()?.parse::<std::net::IpAddr>().ok())
        .map(|ip| SocketAddr::new(ip, 53))
        .collect()
}

/// This machine's nameservers (`/etc/resolv.conf`).
pub fn system_nameservers() -> Vec<SocketAddr> {
    std::fs::read_to_string("/etc/resolv.conf")
        .map(|s| nameservers(&s))
        .unwrap_or_default()
}

/// Asks `servers` in turn for `name`'s records of `rtype` (recursion desired) and returns the
/// first answer: NOERROR (records or none) or NXDOMAIN. Other codes, timeouts and errors move
/// on to the next server; the last one's is returned.
pub async fn lookup(
    servers: &[SocketAddr],
    name: &Name,
    rtype: RecordType,
) -> Result<Message, LookupError> {
    let mut last = LookupError::NoServer;
    for server in servers {
        match ask(*server, name, rtype).await {
            Ok(m) => return Ok(m),
            Err(e) => last = e,
        }
    }
    Err(last)
}

async fn ask(server: SocketAddr, name: &Name, rtype: RecordType) -> Result<Message, LookupError> {
    // Unpredictable (RFC 5452), so an off-path host cannot forge the answer.
    let id: u16 = rand::random();
    let mut query = Message::new();
    query
        .set_id(id)
        .set_message_type(MessageType::Query)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(true)
        .add_query(Query::query(name.clone(), rtype));
    let io = |source| LookupError::Io {
        server,
        name: name.to_ascii(),
        rtype,
        source,
    };
    let timeout = || LookupError::Timeout {
        server,
        name: name.to_ascii(),
        rtype,
    };
    let raw = query
        .to_vec()
        .map_err(|e| io(std::io::Error::other(e.to_string())))?;
    let any: SocketAddr = if server.is_ipv4() {
        ([0, 0, 0, 0], 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = tokio::net::UdpSocket::bind(any).await.map_err(io)?;
    socket.send_to(&raw, server).await.map_err(io)?;
    let mut buf = vec![0u8; 4096];
    let answer = tokio::time::timeout(TIMEOUT, async {
        loop {
            let (n, from) = socket.recv_from(&mut buf).await?;
            if from != server {
                continue;
            }
            if let Ok(m) = Message::from_vec(&buf[..n])
                && m.id() == id
                && m.message_type() == MessageType::Response
            {
                return Ok::<_, std::io::Error>(m);
            }
        }
    })
    .await
    .map_err(|_| timeout())?
    .map_err(io)?;
    let answer = if answer.truncated() {
        tokio::time::timeout(TIMEOUT, over_tcp(server, &raw, id))
            .await
            .map_err(|_| timeout())?
            .map_err(io)?
    } else {
        answer
    };
    match answer.response_code() {
        ResponseCode::NoError | ResponseCode::NXDomain => Ok(answer),
        code => Err(LookupError::Refused {
            server,
            name: name.to_ascii(),
            rtype,
            code,
        }),
    }
}

/// The same question over TCP (RFC 7766: a two-byte length before each message).
async fn over_tcp(server: SocketAddr, raw: &[u8], id: u16) -> std::io::Result<Message> {
    let mut stream = tokio::net::TcpStream::connect(server).await?;
    let len = u16::try_from(raw.len()).map_err(std::io::Error::other)?;
    stream.write_all(&len.to_be_bytes()).await?;
    stream.write_all(raw).await?;
    let mut len = [0u8; 2];
    stream.read_exact(&mut len).await?;
    let mut body = vec![0u8; usize::from(u16::from_be_bytes(len))];
    stream.read_exact(&mut body).await?;
    let m = Message::from_vec(&body).map_err(|e| std::io::Error::other(e.to_string()))?;
    if m.id() != id {
        return Err(std::io::Error::other("answer to another question"));
    }
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolv_conf_nameservers_in_order() {
        let conf = "# comment\nsearch example.org\nnameserver 10.0.0.53\nnameserver  fe80::1%eth0\n\
                    nameserver bogus\noptions ndots:5\n";
        assert_eq!(
            nameservers(conf),
            vec![
                "10.0.0.53:53".parse::<SocketAddr>().unwrap(),
                "[fe80::1]:53".parse().unwrap()
            ]
        );
    }
}
