//! The admin and I/O commands a [`Queue`] sends for tests: Fabrics Connect
//! and properties, Identify, Get Log Page, features, Keep Alive, reads and
//! writes.

use super::{other, Completion, Queue};
use rdmablk_common::fabrics::{ConnectCmd, ConnectData, PropertyCmd};
use rdmablk_common::nvme::identify::IDENTIFY_LEN;
use rdmablk_common::nvme::log::{lid::DISCOVERY as DISCOVERY_LOG, LogRequest};
use rdmablk_common::nvme::{admin, nvm, Cqe, Sgl, Sqe, DSM_RANGE_LEN};
use std::io;

impl Queue {
    /// Fabrics Connect; the caller inspects the status. `sqsize` is 0's based;
    /// `cntlid` is 0xFFFF on the admin queue.
    #[allow(clippy::too_many_arguments)]
    pub fn fabrics_connect(
        &mut self,
        qid: u16,
        sqsize: u16,
        kato_ms: u32,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        cntlid: u16,
    ) -> io::Result<Cqe> {
        Ok(self
            .fabrics_connect_full(qid, sqsize, kato_ms, 0, subnqn, hostnqn, hostid, cntlid)?
            .cqe)
    }

    /// Fabrics Connect with Connect Attributes `cattr` (bit 2: disable SQ
    /// flow control); the whole completion, for the caller to inspect.
    #[allow(clippy::too_many_arguments)]
    pub fn fabrics_connect_full(
        &mut self,
        qid: u16,
        sqsize: u16,
        kato_ms: u32,
        cattr: u8,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        cntlid: u16,
    ) -> io::Result<Completion> {
        let cmd = ConnectCmd {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato: kato_ms,
        };
        let data = ConnectData {
            hostid,
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
        }
        .encode();
        let sqe = cmd.to_sqe(0, &Sgl::Null);
        self.exec(sqe, Some(&data), 0)
    }

    /// Property Get: 8 bytes when `wide`, else 4.
    pub fn prop_get(&mut self, offset: u32, wide: bool) -> io::Result<u64> {
        let sqe = PropertyCmd {
            wide,
            offset,
            value: 0,
        }
        .to_sqe(0, false);
        let c = self.exec_ok(&format!("Property Get {offset:#x}"), sqe, None, 0)?;
        Ok(if wide {
            c.cqe.dw0 as u64 | (c.cqe.dw1 as u64) << 32
        } else {
            c.cqe.dw0 as u64
        })
    }

    /// Property Set of a 4-byte property.
    pub fn prop_set(&mut self, offset: u32, value: u32) -> io::Result<()> {
        let sqe = PropertyCmd {
            wide: false,
            offset,
            value: value as u64,
        }
        .to_sqe(0, true);
        self.exec_ok(&format!("Property Set {offset:#x}"), sqe, None, 0)?;
        Ok(())
    }

    /// The Identify command for `cns`/`nsid`, for callers that check the status.
    pub fn identify_sqe(cns: u8, nsid: u32) -> Sqe {
        let mut sqe = Sqe::new(admin::IDENTIFY, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, cns as u32);
        sqe
    }

    /// Identify; the 4 KiB data structure.
    pub fn identify(&mut self, cns: u8, nsid: u32) -> io::Result<Vec<u8>> {
        let what = format!("Identify CNS {cns:#x} nsid {nsid}");
        let sqe = Queue::identify_sqe(cns, nsid);
        Ok(self.exec_ok(&what, sqe, None, IDENTIFY_LEN as u32)?.data)
    }

    /// Get Log Page: `len` bytes (a multiple of 4) of log `lid` from `offset`.
    pub fn get_log(&mut self, lid: u8, len: u32, offset: u64) -> io::Result<Vec<u8>> {
        let sqe = Queue::get_log_sqe(lid, len, offset);
        let what = format!("Get Log Page {lid:#04x} ({len} bytes at {offset})");
        Ok(self.exec_ok(&what, sqe, None, len)?.data)
    }

    /// The Get Log Page command for `len` bytes of log `lid` from `offset`,
    /// for callers that check the status.
    pub fn get_log_sqe(lid: u8, len: u32, offset: u64) -> Sqe {
        let mut sqe = Sqe::new(admin::GET_LOG_PAGE, 0);
        // As libnvme does: the discovery log names no namespace, the others
        // ask for the controller-wide page.
        sqe.set_nsid(if lid == DISCOVERY_LOG { 0 } else { 0xffff_ffff });
        LogRequest {
            lid,
            lsp: 0,
            rae: false,
            len: len as usize,
            offset,
        }
        .to_sqe(&mut sqe);
        sqe
    }

    /// Set Features; returns CQE dword 0.
    pub fn set_features(&mut self, fid: u8, cdw11: u32) -> io::Result<u32> {
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
        sqe.set_cdw(10, fid as u32);
        sqe.set_cdw(11, cdw11);
        Ok(self
            .exec_ok(&format!("Set Features {fid:#04x}"), sqe, None, 0)?
            .cqe
            .dw0)
    }

    /// Get Features (current value); returns CQE dword 0.
    pub fn get_features(&mut self, fid: u8) -> io::Result<u32> {
        let mut sqe = Sqe::new(admin::GET_FEATURES, 0);
        sqe.set_cdw(10, fid as u32);
        Ok(self
            .exec_ok(&format!("Get Features {fid:#04x}"), sqe, None, 0)?
            .cqe
            .dw0)
    }

    /// Set Features `fid` with NSID `nsid` (FFFFFFFFh: every namespace) and
    /// `cdw11`; the caller checks the status (and CQE dword 0).
    pub fn set_features_ns(&mut self, fid: u8, nsid: u32, cdw11: u32) -> io::Result<Completion> {
        let mut sqe = Sqe::new(admin::SET_FEATURES, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, fid as u32);
        sqe.set_cdw(11, cdw11);
        self.exec(sqe, None, 0)
    }

    /// Get Features `fid` (current value) with NSID `nsid`; the caller
    /// checks the status (and CQE dword 0).
    pub fn get_features_ns(&mut self, fid: u8, nsid: u32) -> io::Result<Completion> {
        let mut sqe = Sqe::new(admin::GET_FEATURES, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, fid as u32);
        self.exec(sqe, None, 0)
    }

    pub fn keep_alive(&mut self) -> io::Result<()> {
        self.exec_ok("Keep Alive", Sqe::new(admin::KEEP_ALIVE, 0), None, 0)?;
        Ok(())
    }

    // ---- namespace I/O ----------------------------------------------------

    /// A Read or Write command: SLBA in cdw10/11, `nlb` blocks (1-based here,
    /// 0's based on the wire) in cdw12.
    pub fn rw_sqe(opcode: u8, nsid: u32, slba: u64, nlb: u32) -> Sqe {
        let mut sqe = Sqe::new(opcode, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, slba as u32);
        sqe.set_cdw(11, (slba >> 32) as u32);
        sqe.set_cdw(12, nlb.wrapping_sub(1) & 0xffff);
        sqe
    }

    pub fn read(&mut self, nsid: u32, slba: u64, nlb: u32, block_size: u32) -> io::Result<Vec<u8>> {
        let sqe = Queue::rw_sqe(nvm::READ, nsid, slba, nlb);
        let what = format!("Read nsid {nsid} slba {slba} nlb {nlb}");
        Ok(self.exec_ok(&what, sqe, None, nlb * block_size)?.data)
    }

    pub fn write(
        &mut self,
        nsid: u32,
        slba: u64,
        data: &[u8],
        block_size: u32,
        fua: bool,
    ) -> io::Result<()> {
        let nlb = whole_blocks(data.len(), block_size)?;
        let mut sqe = Queue::rw_sqe(nvm::WRITE, nsid, slba, nlb);
        if fua {
            sqe.set_cdw(12, sqe.cdw(12) | 1 << 30);
        }
        let what = format!("Write nsid {nsid} slba {slba} nlb {nlb}");
        self.exec_ok(&what, sqe, Some(data), 0)?;
        Ok(())
    }

    pub fn flush(&mut self, nsid: u32) -> io::Result<()> {
        let mut sqe = Sqe::new(nvm::FLUSH, 0);
        sqe.set_nsid(nsid);
        self.exec_ok(&format!("Flush nsid {nsid}"), sqe, None, 0)?;
        Ok(())
    }

    pub fn write_zeroes(
        &mut self,
        nsid: u32,
        slba: u64,
        nlb: u32,
        deallocate: bool,
    ) -> io::Result<()> {
        let mut sqe = Queue::rw_sqe(nvm::WRITE_ZEROES, nsid, slba, nlb);
        if deallocate {
            sqe.set_cdw(12, sqe.cdw(12) | 1 << 25);
        }
        let what = format!("Write Zeroes nsid {nsid} slba {slba} nlb {nlb}");
        self.exec_ok(&what, sqe, None, 0)?;
        Ok(())
    }

    /// Dataset Management with the Deallocate attribute over `(slba, nlb)` ranges.
    pub fn deallocate(&mut self, nsid: u32, ranges: &[(u64, u32)]) -> io::Result<()> {
        if ranges.is_empty() || ranges.len() > 256 {
            return Err(other(format!(
                "DSM takes 1 to 256 ranges, not {}",
                ranges.len()
            )));
        }
        let mut data = vec![0u8; ranges.len() * DSM_RANGE_LEN];
        for (r, &(slba, nlb)) in data.chunks_exact_mut(DSM_RANGE_LEN).zip(ranges) {
            r[4..8].copy_from_slice(&nlb.to_le_bytes());
            r[8..16].copy_from_slice(&slba.to_le_bytes());
        }
        let mut sqe = Sqe::new(nvm::DSM, 0);
        sqe.set_nsid(nsid);
        sqe.set_cdw(10, ranges.len() as u32 - 1);
        sqe.set_cdw(11, 1 << 2);
        self.exec_ok(
            &format!("DSM deallocate nsid {nsid} {ranges:?}"),
            sqe,
            Some(&data),
            0,
        )?;
        Ok(())
    }
}

/// The NLB (1-based) of `len` bytes: 1 to 65536 whole blocks, or an error.
pub(super) fn whole_blocks(len: usize, block_size: u32) -> io::Result<u32> {
    let nlb = len / block_size as usize;
    if nlb == 0 || nlb * block_size as usize != len || nlb > 1 << 16 {
        return Err(other(format!(
            "{len} bytes: not 1 to 65536 whole {block_size}-byte blocks"
        )));
    }
    Ok(nlb as u32)
}
