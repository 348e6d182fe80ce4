//! The NVMe commands a request needs for its current step.

use super::{NbdDriver, Req, Stage, MAX_ZEROES_BLOCKS};
use crate::frontend::nbd::proto::{flags, Command};
use rdmablk_common::nvme::nvm;

/// One NVMe command of a request's current step.
pub(super) struct PlannedCommand {
    /// Its NVM command set opcode.
    pub(super) opcode: u8,
    /// Byte offset in the namespace where it starts (block aligned).
    pub(super) offset: u64,
    /// Bytes it covers (whole blocks).
    pub(super) len: u64,
    /// Where its data starts in the request's buffer, in bytes.
    pub(super) buf_offset: usize,
    /// FUA for a write; deallocate for Write Zeroes and Dataset Management.
    pub(super) fua_or_deallocate: bool,
}

impl NbdDriver {
    /// The NVMe commands a request needs now.
    pub(super) fn plan(&self, req: &Req) -> Vec<PlannedCommand> {
        let block = self.block();
        let mt = self.export.max_transfer as u64;
        let split = |opcode: u8, offset: u64, len: u64, flag: bool, max: u64| {
            let mut v = Vec::new();
            let mut done = 0;
            while done < len {
                let n = (len - done).min(max);
                v.push(PlannedCommand {
                    opcode,
                    offset: offset + done,
                    len: n,
                    buf_offset: done as usize,
                    fua_or_deallocate: flag,
                });
                done += n;
            }
            v
        };
        let r = &req.r;
        match (r.command, req.stage) {
            (Command::Read, _) => split(nvm::READ, req.base, req.span as u64, false, mt),
            (Command::Write | Command::WriteZeroes, Stage::EdgeRead) => {
                // Read the partial head and tail blocks into the spare area
                // after the span.
                let mut v = Vec::new();
                let end = r.offset + r.length as u64;
                if !r.offset.is_multiple_of(block) {
                    v.push(PlannedCommand {
                        opcode: nvm::READ,
                        offset: req.base,
                        len: block,
                        buf_offset: req.span,
                        fua_or_deallocate: false,
                    });
                }
                let tail = end / block * block;
                if !end.is_multiple_of(block)
                    && (tail != req.base || r.offset.is_multiple_of(block))
                {
                    v.push(PlannedCommand {
                        opcode: nvm::READ,
                        offset: tail,
                        len: block,
                        buf_offset: req.span + block as usize,
                        fua_or_deallocate: false,
                    });
                }
                v
            }
            (Command::Write, _) | (Command::WriteZeroes, _) if req.rmw() => split(
                nvm::WRITE,
                req.base,
                req.span as u64,
                r.flags & flags::FUA != 0,
                mt,
            ),
            (Command::Flush, _) => vec![PlannedCommand {
                opcode: nvm::FLUSH,
                offset: 0,
                len: 0,
                buf_offset: 0,
                fua_or_deallocate: false,
            }],
            (Command::WriteZeroes, _) => {
                let dealloc = r.flags & flags::NO_HOLE == 0 && self.export.ns.deallocate_zeroes;
                let (s, e) = (
                    r.offset.next_multiple_of(block),
                    (r.offset + r.length as u64) / block * block,
                );
                if s < e {
                    split(
                        nvm::WRITE_ZEROES,
                        s,
                        e - s,
                        dealloc,
                        MAX_ZEROES_BLOCKS * block,
                    )
                } else {
                    Vec::new()
                }
            }
            (Command::Trim, _) => {
                let (s, e) = (
                    r.offset.next_multiple_of(block),
                    (r.offset + r.length as u64) / block * block,
                );
                if s < e {
                    split(nvm::DSM, s, e - s, true, u32::MAX as u64 / block * block)
                } else {
                    Vec::new()
                }
            }
            _ => Vec::new(),
        }
    }
}
