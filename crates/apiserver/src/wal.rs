//! Durable storage: a snapshot plus a write-ahead log of framed, checksummed records.
//!
//! Written by hand because what we need is small and specific: every acknowledged write must
//! survive SIGKILL (so each record reaches the kernel with one `write` before the request is
//! answered), and a process killed mid-write must leave a file that opens cleanly (so each
//! record carries its length and a CRC32, and recovery truncates a torn tail). Embedded
//! databases such as redb only persist on fsync'd commits, which would cap us at a few
//! hundred writes per second on this machine.
//!
//! Record: `len: u32 LE | crc32(payload): u32 LE | payload`, payload = `op: u8 | rv: u64 LE |
//! key | namespace | name | json` with each string as `u32 LE length | bytes`.

use std::fs::{File, OpenOptions};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// One logged change.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// An object was created or replaced.
    Put {
        /// Resource version of the write.
        rv: u64,
        /// Storage key (`group/resource`).
        key: String,
        /// Namespace, "" for cluster scope.
        namespace: String,
        /// Name.
        name: String,
        /// The object, serialized.
        json: Vec<u8>,
    },
    /// An object was removed.
    Delete {
        /// Resource version of the delete.
        rv: u64,
        /// Storage key.
        key: String,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
}

impl Record {
    /// Resource version of this change.
    pub fn rv(&self) -> u64 {
        match self {
            Record::Put { rv, .. } | Record::Delete { rv, .. } => *rv,
        }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        let start = out.len();
        out.extend_from_slice(&[0; 8]);
        let (op, rv, key, namespace, name, json): (u8, u64, &str, &str, &str, &[u8]) = match self {
            Record::Put {
                rv,
                key,
                namespace,
                name,
                json,
            } => (1, *rv, key, namespace, name, json),
            Record::Delete {
                rv,
                key,
                namespace,
                name,
            } => (2, *rv, key, namespace, name, &[]),
        };
        out.push(op);
        out.extend_from_slice(&rv.to_le_bytes());
        for field in [key.as_bytes(), namespace.as_bytes(), name.as_bytes(), json] {
            out.extend_from_slice(&(field.len() as u32).to_le_bytes());
            out.extend_from_slice(field);
        }
        let payload_len = (out.len() - start - 8) as u32;
        let crc = crc32fast::hash(&out[start + 8..]);
        out[start..start + 4].copy_from_slice(&payload_len.to_le_bytes());
        out[start + 4..start + 8].copy_from_slice(&crc.to_le_bytes());
    }

    fn decode(payload: &[u8]) -> Option<Record> {
        let op = *payload.first()?;
        let rv = u64::from_le_bytes(payload.get(1..9)?.try_into().ok()?);
        let mut pos = 9;
        let mut fields: Vec<&[u8]> = Vec::with_capacity(4);
        for _ in 0..4 {
            let len = u32::from_le_bytes(payload.get(pos..pos + 4)?.try_into().ok()?) as usize;
            pos += 4;
            fields.push(payload.get(pos..pos + len)?);
            pos += len;
        }
        let text = |b: &[u8]| String::from_utf8(b.to_vec()).ok();
        let (key, namespace, name) = (text(fields[0])?, text(fields[1])?, text(fields[2])?);
        match op {
            1 => Some(Record::Put {
                rv,
                key,
                namespace,
                name,
                json: fields[3].to_vec(),
            }),
            2 => Some(Record::Delete {
                rv,
                key,
                namespace,
                name,
            }),
            _ => None,
        }
    }
}

/// Reads every intact record of a file; returns them and the length of the intact prefix.
fn read_records(path: &Path) -> std::io::Result<(Vec<Record>, u64)> {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut good = 0u64;
    let mut header = [0u8; 8];
    loop {
        if reader.read_exact(&mut header).is_err() {
            break;
        }
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let mut payload = vec![0; len];
        if reader.read_exact(&mut payload).is_err() || crc32fast::hash(&payload) != crc {
            break;
        }
        match Record::decode(&payload) {
            Some(record) => records.push(record),
            None => break,
        }
        good += 8 + len as u64;
    }
    Ok((records, good))
}

/// The data directory's log: appends records, compacts into a snapshot.
pub struct Wal {
    dir: PathBuf,
    log: BufWriter<File>,
    log_bytes: u64,
    buf: Vec<u8>,
}

/// Compact when the log grows past this many bytes.
const COMPACT_AT: u64 = 256 << 20;

impl Wal {
    /// Opens the directory: returns the log ready for appends and every record to replay
    /// (snapshot first, then the log's records newer than the snapshot). A torn tail left
    /// by a killed process is cut off.
    pub fn open(dir: &Path) -> std::io::Result<(Wal, Vec<Record>)> {
        std::fs::create_dir_all(dir)?;
        // The directory holds Secrets, the CA key and the admin token: its owner's only, as
        // etcd's data directory is (0700).
        std::fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
        let snapshot_path = dir.join("snapshot");
        let log_path = dir.join("wal");
        let (mut records, snap_len) = read_records(&snapshot_path)?;
        if snapshot_path.exists() && snap_len != std::fs::metadata(&snapshot_path)?.len() {
            // Snapshots are renamed into place only once complete, so damage here is not a
            // torn write but corruption: refuse to start rather than silently lose objects.
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{} is corrupt at byte {snap_len}", snapshot_path.display()),
            ));
        }
        let snapshot_rv = records.iter().map(Record::rv).max().unwrap_or(0);
        let (log_records, log_len) = read_records(&log_path)?;
        records.extend(log_records.into_iter().filter(|r| r.rv() > snapshot_rv));
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&log_path)?;
        if file.metadata()?.len() != log_len {
            tracing::warn!(
                path = %log_path.display(),
                "cutting a torn record off the write-ahead log at byte {log_len}"
            );
            file.set_len(log_len)?;
        }
        file.seek(SeekFrom::Start(log_len))?;
        Ok((
            Wal {
                dir: dir.to_path_buf(),
                log: BufWriter::with_capacity(1 << 16, file),
                log_bytes: log_len,
                buf: Vec::with_capacity(4096),
            },
            records,
        ))
    }

    /// Appends one record and hands it to the kernel, so it survives the process being killed.
    pub fn append(&mut self, record: &Record) -> std::io::Result<()> {
        self.buf.clear();
        record.encode(&mut self.buf);
        self.log.write_all(&self.buf)?;
        self.log.flush()?;
        self.log_bytes += self.buf.len() as u64;
        Ok(())
    }

    /// Whether the log is big enough to be worth compacting.
    pub fn wants_compaction(&self) -> bool {
        self.log_bytes > COMPACT_AT
    }

    /// Writes `objects` (every live object, as Put records) as the new snapshot and empties
    /// the log. Crash-safe: the snapshot is renamed into place before the log is truncated,
    /// and replay skips log records the snapshot already holds.
    pub fn compact(&mut self, objects: impl Iterator<Item = Record>) -> std::io::Result<()> {
        let mut data = Vec::new();
        for record in objects {
            record.encode(&mut data);
        }
        crate::fsutil::write_atomic(&self.dir.join("snapshot"), &data)?;
        self.log.flush()?;
        let file = self.log.get_mut();
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        self.log_bytes = 0;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(rv: u64, name: &str) -> Record {
        Record::Put {
            rv,
            key: "/configmaps".into(),
            namespace: "default".into(),
            name: name.into(),
            json: format!("{{\"n\":\"{name}\"}}").into_bytes(),
        }
    }

    #[test]
    fn replays_appended_records_and_cuts_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        {
            let (mut wal, records) = Wal::open(dir.path()).unwrap();
            assert!(records.is_empty());
            wal.append(&put(1, "a")).unwrap();
            wal.append(&put(2, "b")).unwrap();
            wal.append(&Record::Delete {
                rv: 3,
                key: "/configmaps".into(),
                namespace: "default".into(),
                name: "a".into(),
            })
            .unwrap();
        }
        // A killed writer leaves half a record behind.
        let log = dir.path().join("wal");
        let intact = std::fs::metadata(&log).unwrap().len();
        let mut garbage = Vec::new();
        put(4, "c").encode(&mut garbage);
        garbage.truncate(garbage.len() - 3);
        OpenOptions::new()
            .append(true)
            .open(&log)
            .unwrap()
            .write_all(&garbage)
            .unwrap();

        let (mut wal, records) = Wal::open(dir.path()).unwrap();
        assert_eq!(
            records.iter().map(Record::rv).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(std::fs::metadata(&log).unwrap().len(), intact);
        wal.append(&put(4, "d")).unwrap();
        drop(wal);
        let (_, records) = Wal::open(dir.path()).unwrap();
        assert_eq!(records.last(), Some(&put(4, "d")));
    }

    #[test]
    fn compaction_keeps_objects_and_skips_stale_log_records() {
        let dir = tempfile::tempdir().unwrap();
        let (mut wal, _) = Wal::open(dir.path()).unwrap();
        for rv in 1..=5 {
            wal.append(&put(rv, &format!("o{rv}"))).unwrap();
        }
        wal.compact([put(4, "o4"), put(5, "o5")].into_iter())
            .unwrap();
        wal.append(&put(6, "o6")).unwrap();
        drop(wal);
        let (_, records) = Wal::open(dir.path()).unwrap();
        assert_eq!(records, vec![put(4, "o4"), put(5, "o5"), put(6, "o6")]);
    }

    #[test]
    fn corrupt_snapshot_refuses_to_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut data = Vec::new();
        put(1, "a").encode(&mut data);
        let last = data.len() - 1;
        data[last] ^= 0xff;
        std::fs::write(dir.path().join("snapshot"), &data).unwrap();
        let err = Wal::open(dir.path()).err().expect("corruption detected");
        assert!(err.to_string().contains("corrupt"), "{err}");
    }
}
