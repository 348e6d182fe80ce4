//! The partition tests' workload: clients that write unique values to a
//! few blocks of several namespaces through NBD exports (`rdmablk connect
//! --nbd`) and read them back, one operation at a time each, recording
//! every operation with its start, end and outcome in a
//! [`history`](crate::history) for the checker.
//!
//! A block holds its value's encoding: a magic, the namespace, the block
//! number and the value, then a pattern derived from all three over the
//! rest of the 4 KiB. All zeros reads as [`INITIAL`]; anything that is not
//! an encoding of this block, whole, reads as [`GARBAGE`] (a torn write, a
//! write meant for another block or namespace).

use crate::history::{Kind, Op, Outcome, Recorder, Register, GARBAGE, INITIAL};
use crate::nbd::NbdClient;
use crate::Rng;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The size of a register: one 4 KiB block.
pub const BLOCK: usize = 4096;
const MAGIC: u64 = 0x7264_6d61_626c_6b31; // "rdmablk1"

/// The bytes of `value` written to `register`.
pub fn encode(register: Register, value: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK];
    b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
    b[8..12].copy_from_slice(&register.namespace.to_le_bytes());
    b[16..24].copy_from_slice(&register.block.to_le_bytes());
    b[24..32].copy_from_slice(&value.to_le_bytes());
    let mut rng = Rng::new(value ^ register.block.rotate_left(40) ^ u64::from(register.namespace));
    rng.fill(&mut b[32..]);
    b
}

/// The value a read of `register` returned in `bytes`.
pub fn decode(register: Register, bytes: &[u8]) -> u64 {
    if bytes.iter().all(|&b| b == 0) {
        return INITIAL;
    }
    if bytes.len() != BLOCK {
        return GARBAGE;
    }
    let value = u64::from_le_bytes(bytes[24..32].try_into().expect("8 bytes"));
    if value == INITIAL || value == GARBAGE || encode(register, value) != bytes {
        return GARBAGE;
    }
    value
}

/// An NBD export of one namespace.
#[derive(Clone, Debug)]
pub struct Export {
    /// The namespace it serves (the registers' `namespace`).
    pub namespace: u32,
    /// Its unix socket.
    pub socket: PathBuf,
}

/// How the clients work.
#[derive(Clone, Debug)]
pub struct Options {
    /// Registers per namespace: blocks `0..blocks`.
    pub blocks: u64,
    /// Clients per export.
    pub clients: u32,
    /// How long one operation may wait before the client gives up on it
    /// (recorded as never ended) and connects again.
    pub deadline: Duration,
    /// Decides the clients' choices of block and of reading or writing.
    pub seed: u64,
}

/// Clients running until [`Workload::stop`].
pub struct Workload {
    stop: Arc<AtomicBool>,
    clients: Vec<JoinHandle<()>>,
}

/// One client: its NBD connection (None between a broken one and the next)
/// and what it records as.
struct Client {
    export: Export,
    process: u32,
    deadline: Duration,
    conn: Option<NbdClient>,
    recorder: Recorder,
}

impl Client {
    fn new(export: &Export, process: u32, opts: &Options, recorder: &Recorder) -> Client {
        Client {
            export: export.clone(),
            process,
            deadline: opts.deadline,
            conn: None,
            recorder: recorder.clone(),
        }
    }

    fn connection(&mut self) -> io::Result<&mut NbdClient> {
        if self.conn.is_none() {
            let mut c = NbdClient::connect(&self.export.socket)
                .map_err(|e| io::Error::other(format!("connecting: {e:?}")))?;
            c.set_deadline(self.deadline)?;
            self.conn = Some(c);
        }
        Ok(self.conn.as_mut().expect("just made"))
    }

    /// Runs one operation and records it: a write of `value`, or a read
    /// (`value` None).
    fn op(&mut self, block: u64, value: Option<u64>) {
        let register = Register {
            namespace: self.export.namespace,
            block,
        };
        let offset = block * BLOCK as u64;
        let start = self.recorder.now();
        let done = self.connection().and_then(|c| match value {
            Some(v) => c.write(offset, &encode(register, v)).map(|()| v),
            None => c.read(offset, BLOCK as u32).map(|b| decode(register, &b)),
        });
        let (kind, written) = match value {
            Some(v) => (Kind::Write, v),
            None => (Kind::Read, INITIAL),
        };
        let (outcome, read, end) = match done {
            Ok(v) => (Outcome::Ok, v, Some(self.recorder.now())),
            Err(e) => {
                let timed_out = matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                );
                // An NBD error reply leaves the connection in step; any
                // other error does not.
                if !e.to_string().starts_with("NBD error") {
                    self.conn = None;
                }
                let end = (!timed_out).then(|| self.recorder.now());
                (Outcome::Unknown, INITIAL, end)
            }
        };
        self.recorder.push(Op {
            process: self.process,
            kind,
            register,
            value: if kind == Kind::Write { written } else { read },
            start,
            end,
            outcome,
        });
        if outcome != Outcome::Ok {
            // Not a busy loop against a dead export.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Workload {
    /// Starts `opts.clients` clients on each export, recording into
    /// `recorder`; client `i` records as process `first_process + i`.
    pub fn start(
        exports: &[Export],
        opts: &Options,
        recorder: &Recorder,
        first_process: u32,
    ) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let mut clients = Vec::new();
        let mut process = first_process;
        for export in exports {
            for _ in 0..opts.clients {
                let mut c = Client::new(export, process, opts, recorder);
                let mut rng = Rng::new(opts.seed ^ u64::from(process).rotate_left(32));
                let (stop, blocks) = (stop.clone(), opts.blocks);
                clients.push(std::thread::spawn(move || {
                    let mut seq = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let block = rng.below(blocks);
                        if rng.below(2) == 0 {
                            seq += 1;
                            c.op(block, Some(u64::from(c.process) << 32 | seq));
                        } else {
                            c.op(block, None);
                        }
                    }
                }));
                process += 1;
            }
        }
        Workload { stop, clients }
    }

    /// Stops the clients once their current operations end.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().expect("a workload client panicked");
        }
    }
}

/// Reads every register of every export once (as process `process`),
/// recorded: the final reads that show what survived.
pub fn read_all(exports: &[Export], opts: &Options, recorder: &Recorder, process: u32) {
    for export in exports {
        let mut c = Client::new(export, process, opts, recorder);
        for block in 0..opts.blocks {
            c.op(block, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_reads_back_only_in_its_own_block() {
        let r = Register {
            namespace: 2,
            block: 7,
        };
        let b = encode(r, 42 << 32 | 9);
        assert_eq!(decode(r, &b), 42 << 32 | 9);
        assert_eq!(decode(r, &vec![0; BLOCK]), INITIAL);
        let elsewhere = Register { block: 8, ..r };
        assert_eq!(decode(elsewhere, &b), GARBAGE, "another block's data");
        let other_ns = Register { namespace: 3, ..r };
        assert_eq!(decode(other_ns, &b), GARBAGE, "another namespace's data");
        let mut torn = b.clone();
        torn[BLOCK / 2..].copy_from_slice(&encode(r, 43)[BLOCK / 2..]);
        assert_eq!(decode(r, &torn), GARBAGE, "half of another write");
    }
}
