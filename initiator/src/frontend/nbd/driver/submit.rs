//! Putting requests' NVMe commands on the engine's queue: the order of
//! overlapping writes, batches as queue slots allow, and the edge blocks of
//! read-modify-write.

use super::{tag, NbdDriver, Req, Stage};
use crate::frontend::nbd::proto::{errno, Command};
use crate::host::block::{self, DSM_RANGE_LEN};
use crate::host::engine::Cx;
use crate::host::Data;
use rdmablk_common::mem::{Arena, ArenaBuf};
use rdmablk_common::nvme::nvm;
use std::sync::atomic::Ordering;

impl NbdDriver {
    /// Moves a received request on: edge reads for unaligned writes, else its commands.
    pub(super) fn start(&mut self, ci: usize, ri: usize, cx: &mut Cx) {
        let block = self.block();
        let c = self.clients[ci].as_ref().expect("live client");
        let req = c.reqs[ri].as_ref().expect("request");
        let unaligned = !req.r.offset.is_multiple_of(block)
            || !(req.r.offset + req.r.length as u64).is_multiple_of(block);
        let rmw = req.rmw() && unaligned;
        let writes = matches!(
            req.r.command,
            Command::Write | Command::WriteZeroes | Command::Trim
        );
        if writes {
            // A read-modify-write rewrites whole blocks: it must not overlap
            // another write in progress, nor another write overlap it.
            let (s, e) = if req.span > 0 {
                (req.base, req.base + req.span as u64)
            } else {
                let end = req.r.offset + req.r.length as u64;
                (req.r.offset / block * block, end.next_multiple_of(block))
            };
            let conflict = self.writing.iter().any(|&(wc, wr, ws, we)| {
                let other_rmw = self.clients[wc]
                    .as_ref()
                    .and_then(|c| c.reqs[wr].as_ref())
                    .is_some_and(|o| o.rmw_unaligned);
                ws < e && s < we && (rmw || other_rmw)
            });
            if conflict {
                self.blocked.push((ci, ri));
                return;
            }
            self.writing.push((ci, ri, s, e));
        }
        let req = self.clients[ci]
            .as_mut()
            .and_then(|c| c.reqs[ri].as_mut())
            .expect("request");
        req.rmw_unaligned = rmw;
        req.stage = if rmw { Stage::EdgeRead } else { Stage::Queued };
        req.submitted = 0;
        self.queued.push_back((ci, ri));
        self.submit_queued(cx);
    }

    /// Submits the commands of queued requests as queue slots allow; a
    /// request with more commands than free slots goes out in batches.
    pub(super) fn submit_queued(&mut self, cx: &mut Cx) {
        while let Some(&(ci, ri)) = self.queued.front() {
            let Some(req) = self
                .clients
                .get(ci)
                .and_then(Option::as_ref)
                .and_then(|c| c.reqs[ri].as_ref())
            else {
                self.queued.pop_front();
                continue;
            };
            let plan = self.plan(req);
            if plan.is_empty() {
                self.queued.pop_front();
                self.reply(ci, ri, cx);
                continue;
            }
            if cx.paths.failed().is_some() {
                if !self.give_up.load(Ordering::Acquire) {
                    return; // wait for the association to come back
                }
                self.queued.pop_front();
                let req = self.clients[ci]
                    .as_mut()
                    .and_then(|c| c.reqs[ri].as_mut())
                    .expect("request");
                req.error = errno::EIO;
                if req.parts_left == 0 {
                    self.reply(ci, ri, cx);
                }
                continue;
            }
            let is_trim = req.r.command == Command::Trim;
            if is_trim && req.buf.is_none() {
                // The DSM ranges, 16 bytes each, live in the arena with the request.
                let Some(b) = cx.arena.alloc(DSM_RANGE_LEN * plan.len()) else {
                    return;
                };
                let c = self.clients[ci].as_mut().expect("live client");
                c.held += b.capacity();
                let req = c.reqs[ri].as_mut().expect("request");
                req.buf = Some(b);
            }
            let free = cx.paths.free_slots();
            let req = self.clients[ci]
                .as_mut()
                .and_then(|c| c.reqs[ri].as_mut())
                .expect("request");
            let batch = (plan.len() - req.submitted).min(free);
            if batch == 0 {
                return; // completions free slots; pump retries
            }
            let first = req.submitted;
            req.submitted += batch;
            req.parts_left += batch;
            if req.submitted == plan.len() {
                self.queued.pop_front();
            }
            if req.stage == Stage::Queued {
                req.stage = Stage::Io;
            }
            let block = self.export.ns.block_size as u64;
            let nsid = self.export.ns.nsid;
            let buf = req.buf.as_ref();
            for (i, cmd) in plan.iter().enumerate().skip(first).take(batch) {
                let lba = cmd.offset / block;
                let (data, to_host) = match cmd.opcode {
                    nvm::READ | nvm::WRITE => {
                        let b = buf.expect("data request has a buffer");
                        let to_host = cmd.opcode == nvm::READ;
                        (cx.data(b, cmd.buf_offset, cmd.len as usize), to_host)
                    }
                    nvm::DSM => {
                        let b = buf.expect("allocated above");
                        let mut range = [0u8; DSM_RANGE_LEN];
                        block::dsm_range(&mut range, lba, (cmd.len / block) as u32);
                        cx.arena.write(b, i * DSM_RANGE_LEN, &range);
                        (cx.data(b, i * DSM_RANGE_LEN, DSM_RANGE_LEN), false)
                    }
                    _ => (Data::NONE, false),
                };
                let blocks = cmd.len / block;
                let sqe = block::sqe(cmd.opcode, nsid, lba, blocks, cmd.fua_or_deallocate);
                // The buffers stay the request's until it is finished, which
                // waits for every command's completion.
                let ok = cx.paths.submit(sqe, data, to_host, tag(ci, ri));
                debug_assert!(ok, "free slots were checked");
            }
        }
    }

    /// Patches the edge blocks read for an unaligned write around the payload.
    pub(super) fn merge_edges(&self, req: &Req, cx: &mut Cx) {
        let block = self.block() as usize;
        let b = req.buf.as_ref().expect("write buffer");
        // The edge blocks were read after the span, at `req.span` (head) and
        // `req.span + block` (tail).
        let head = (req.r.offset - req.base) as usize;
        let end = head + req.r.length as usize;
        if !head.is_multiple_of(block) {
            copy_within(cx.arena, b, req.span, 0, head);
        }
        if !end.is_multiple_of(block) {
            let tail = end / block * block;
            let n = req.span - end;
            let from = if tail == 0 && !head.is_multiple_of(block) {
                // Head and tail are the same block: it was read once, into the head slot.
                req.span + end
            } else {
                req.span + block + (end - tail)
            };
            copy_within(cx.arena, b, from, end, n);
        }
    }
}

/// Copies `len` bytes of an arena buffer from byte `from` to byte `to`
/// (ranges that do not overlap), through a stack chunk.
fn copy_within(arena: &mut Arena, b: &ArenaBuf, from: usize, to: usize, len: usize) {
    let mut chunk = [0u8; 4096];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(chunk.len());
        arena.read(b, from + done, &mut chunk[..n]);
        arena.write(b, to + done, &chunk[..n]);
        done += n;
    }
}
