//! A minimal NBD client for tests that need many connections or a
//! misbehaving one: fixed newstyle handshake with `NBD_OPT_GO`, simple
//! replies, reads and writes. Everything else uses real clients (nbdcopy,
//! nbdinfo, qemu-io, fio).

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const FLAG_C_FIXED_NEWSTYLE: u32 = 1;
const FLAG_C_NO_ZEROES: u32 = 2;
const OPT_GO: u32 = 7;
const REP_ACK: u32 = 1;
/// `NBD_REP_ERR_POLICY`.
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
const CMD_READ: u16 = 0;
const CMD_WRITE: u16 = 1;
const CMD_TRIM: u16 = 4;
const CMD_WRITE_ZEROES: u16 = 6;

/// A client in its transmission phase.
pub struct NbdClient {
    s: UnixStream,
    cookie: u64,
}

/// Why a handshake did not end in the transmission phase.
#[derive(Debug)]
pub enum Refused {
    Io(io::Error),
    /// An error reply to `NBD_OPT_GO`: its type and message.
    Reply(u32, String),
}

impl From<io::Error> for Refused {
    fn from(e: io::Error) -> Refused {
        Refused::Io(e)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Reads the server's greeting and checks it is fixed newstyle.
pub fn read_greeting(s: &mut UnixStream) -> io::Result<()> {
    let mut g = [0u8; 18];
    s.read_exact(&mut g)?;
    if u64_at(&g, 0) != NBDMAGIC || u64_at(&g, 8) != IHAVEOPT {
        return Err(io::Error::other("not an NBD newstyle greeting"));
    }
    Ok(())
}

/// The client flags a fixed newstyle client sends after the greeting.
pub fn client_flags() -> [u8; 4] {
    (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()
}

impl NbdClient {
    /// Connects to the export on `socket` and chooses its default export.
    pub fn connect(socket: &Path) -> Result<NbdClient, Refused> {
        let mut s = UnixStream::connect(socket)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        read_greeting(&mut s)?;
        s.write_all(&client_flags())?;
        // NBD_OPT_GO: the default export (""), no information requests.
        let mut opt = Vec::new();
        opt.extend_from_slice(&IHAVEOPT.to_be_bytes());
        opt.extend_from_slice(&OPT_GO.to_be_bytes());
        opt.extend_from_slice(&6u32.to_be_bytes());
        opt.extend_from_slice(&0u32.to_be_bytes());
        opt.extend_from_slice(&0u16.to_be_bytes());
        s.write_all(&opt)?;
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h)?;
            if u64_at(&h, 0) != OPT_REPLY_MAGIC {
                return Err(io::Error::other("bad option reply magic").into());
            }
            let (kind, len) = (u32_at(&h, 12), u32_at(&h, 16) as usize);
            let mut data = vec![0u8; len];
            s.read_exact(&mut data)?;
            if kind == REP_ACK {
                return Ok(NbdClient { s, cookie: 0 });
            }
            if kind & (1 << 31) != 0 {
                let msg = String::from_utf8_lossy(&data).into_owned();
                return Err(Refused::Reply(kind, msg));
            }
        }
    }

    /// How long a read or write on the connection may wait (30 s after
    /// [`NbdClient::connect`]); past it the call fails with `WouldBlock`
    /// or `TimedOut` and the connection is out of step.
    pub fn set_deadline(&mut self, d: Duration) -> io::Result<()> {
        self.s.set_read_timeout(Some(d))?;
        self.s.set_write_timeout(Some(d))
    }

    fn request(&mut self, cmd: u16, offset: u64, len: u32) -> io::Result<u64> {
        self.cookie += 1;
        let mut r = Vec::with_capacity(28);
        r.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        r.extend_from_slice(&0u16.to_be_bytes());
        r.extend_from_slice(&cmd.to_be_bytes());
        r.extend_from_slice(&self.cookie.to_be_bytes());
        r.extend_from_slice(&offset.to_be_bytes());
        r.extend_from_slice(&len.to_be_bytes());
        self.s.write_all(&r)?;
        Ok(self.cookie)
    }

    fn reply(&mut self, cookie: u64) -> io::Result<()> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        if u32_at(&h, 0) != SIMPLE_REPLY_MAGIC || u64_at(&h, 8) != cookie {
            return Err(io::Error::other("unexpected reply"));
        }
        match u32_at(&h, 4) {
            0 => Ok(()),
            e => Err(io::Error::other(format!("NBD error {e}"))),
        }
    }

    /// Sends a read request and does not wait for (or read) its reply.
    pub fn post_read(&mut self, offset: u64, len: u32) -> io::Result<()> {
        self.request(CMD_READ, offset, len).map(drop)
    }

    /// Writes `data` at `offset` and waits for the reply.
    pub fn write(&mut self, offset: u64, data: &[u8]) -> io::Result<()> {
        let cookie = self.request(CMD_WRITE, offset, data.len() as u32)?;
        self.s.write_all(data)?;
        self.reply(cookie)
    }

    /// Trims `len` bytes at `offset`.
    pub fn trim(&mut self, offset: u64, len: u32) -> io::Result<()> {
        let cookie = self.request(CMD_TRIM, offset, len)?;
        self.reply(cookie)
    }

    /// Writes `len` zero bytes at `offset`.
    pub fn write_zeroes(&mut self, offset: u64, len: u32) -> io::Result<()> {
        let cookie = self.request(CMD_WRITE_ZEROES, offset, len)?;
        self.reply(cookie)
    }

    /// Reads `len` bytes at `offset`.
    pub fn read(&mut self, offset: u64, len: u32) -> io::Result<Vec<u8>> {
        let cookie = self.request(CMD_READ, offset, len)?;
        self.reply(cookie)?;
        let mut data = vec![0u8; len as usize];
        self.s.read_exact(&mut data)?;
        Ok(data)
    }
}
