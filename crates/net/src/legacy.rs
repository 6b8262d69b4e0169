//! What an earlier version of a gateway left on the node under names this version no longer
//! uses: a hostNetwork gateway killed during an upgrade leaves its nftables table (and its
//! interface, while anything still holds the device), whose rules would keep translating the
//! same prefixes beside the new table's. Removed when the gateway starts.

use futures::TryStreamExt;

use crate::nft;

/// Why a leftover could not be removed.
#[derive(Debug, thiserror::Error)]
pub enum LegacyError {
    /// The netlink socket could not be opened.
    #[error("opening rtnetlink socket: {0}")]
    Connect(std::io::Error),
    /// The kernel refused to look up or delete an interface.
    #[error("removing interface `{interface}` left by an earlier version: {source}")]
    Link {
        /// The interface's name.
        interface: String,
        /// The kernel's answer.
        source: rtnetlink::Error,
    },
    /// `nft` could not delete a table.
    #[error("removing nftables table `{table}` left by an earlier version: {source}")]
    Table {
        /// The table's name (family inet).
        table: String,
        /// The failure.
        source: nft::NftError,
    },
}

/// Removes the interfaces and nftables tables (family inet) named in `interfaces` and
/// `tables`, where they exist; nothing else is touched. Returns what was removed.
pub async fn remove(interfaces: &[String], tables: &[String]) -> Result<Vec<String>, LegacyError> {
    let mut removed = Vec::new();
    for table in tables {
        if nft::read_table(table)
            .await
            .map_err(|source| LegacyError::Table {
                table: table.clone(),
                source,
            })?
            .is_some()
        {
            nft::delete_table(table)
                .await
                .map_err(|source| LegacyError::Table {
                    table: table.clone(),
                    source,
                })?;
            removed.push(format!("nftables table {table}"));
        }
    }
    if interfaces.is_empty() {
        return Ok(removed);
    }
    let (conn, handle, _) = rtnetlink::new_connection().map_err(LegacyError::Connect)?;
    let task = tokio::spawn(conn);
    let result = async {
        for interface in interfaces {
            let err = |source| LegacyError::Link {
                interface: interface.clone(),
                source,
            };
            let found = handle
                .link()
                .get()
                .match_name(interface.clone())
                .execute()
                .try_next()
                .await;
            let index = match found {
                Ok(Some(link)) => link.header.index,
                Ok(None) => continue,
                Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -ENODEV => {
                    continue;
                }
                Err(e) => return Err(err(e)),
            };
            handle.link().del(index).execute().await.map_err(err)?;
            removed.push(format!("interface {interface}"));
        }
        Ok(())
    }
    .await;
    task.abort();
    result.map(|()| removed)
}

/// ENODEV (Linux): the kernel's answer for a name no interface has.
const ENODEV: i32 = 19;
