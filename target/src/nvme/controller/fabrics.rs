//! Fabrics commands on an established queue (Property Get and Set,
//! Disconnect; Connect and authentication are the `connect` module's), the
//! controller properties they read and write, and keep-alive.

use super::aen::Events;
use super::{Controller, Reply, VERSION};
use crate::nvme::fabric::ADMIN_QUEUE_SIZE;
use rdmablk_common::fabrics::{fctype, PropertyCmd};
use rdmablk_common::nvme::{property, Sqe, Status};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// Keep-alive granularity in 100 ms units (KAS).
pub(super) const KAS: u16 = 10;

/// How long enabling the controller may take at most, in 500 ms units
/// (CAP.TO and CRTO.CRWMT): 7.5 s.
const READY_TIMEOUT: u16 = 15;

impl Controller {
    pub(super) fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// Restarts the keep-alive timer.
    pub fn keep_alive(&self) {
        self.last_keep_alive.store(self.now_ms(), Ordering::Release);
    }

    /// True once the host has been silent for longer than KATO.
    pub fn keep_alive_expired(&self) -> bool {
        let kato = self.kato_ms.load(Ordering::Acquire) as u64;
        kato != 0
            && self
                .now_ms()
                .saturating_sub(self.last_keep_alive.load(Ordering::Acquire))
                > kato
    }

    /// A Fabrics command other than Connect on an established queue.
    pub fn fabrics(&self, sqe: &Sqe, qid: u16) -> Reply {
        match sqe.fctype() {
            fctype::PROPERTY_GET if qid == 0 => self.property_get(&PropertyCmd::from_sqe(sqe)),
            fctype::PROPERTY_SET if qid == 0 => self.property_set(&PropertyCmd::from_sqe(sqe)),
            // NVMe Base 2.1, Figure 541 note 3: a Fabrics command an I/O
            // queue does not support is an Invalid Field there.
            fctype::PROPERTY_GET | fctype::PROPERTY_SET => Reply::status(Status::INVALID_FIELD),
            fctype::CONNECT => Reply::status(Status::COMMAND_SEQUENCE_ERROR),
            // NVMe Base 2.1, 6.4: Disconnect deletes an I/O queue; on the
            // admin queue it is an Invalid Queue Type.
            fctype::DISCONNECT if qid == 0 => Reply::status(Status::INVALID_QUEUE_TYPE),
            fctype::DISCONNECT => Reply::ok(0),
            _ => Reply::status(Status::INVALID_OPCODE),
        }
    }

    fn cap(&self) -> u64 {
        let mqes = if self.subsys.is_discovery() {
            ADMIN_QUEUE_SIZE - 1
        } else {
            self.caps.max_queue_entries - 1
        } as u64;
        // MQES, CQR (contiguous queues required), TO, CSS = NVM command
        // set, CRMS.CRWMS (ready with media: NVMe Base 2.0, 3.1.4.1 makes
        // it 1).
        mqes | 1 << 16 | (READY_TIMEOUT as u64) << 24 | 1 << 37 | 1 << 59
    }

    fn property_get(&self, p: &PropertyCmd) -> Reply {
        let st = self.state.lock().expect("controller state");
        let value = match (p.offset, p.wide) {
            (property::CAP, _) => self.cap(),
            (property::VS, false) => VERSION as u64,
            (property::CC, false) => st.cc as u64,
            (property::CSTS, false) => st.csts as u64,
            // CRTO (NVMe Base 2.0, 3.1.4.21): ready with media within
            // CAP.TO; CRIMT 0, as CRMS.CRIMS is clear.
            (property::CRTO, false) => READY_TIMEOUT as u64,
            _ => return Reply::status(Status::INVALID_FIELD),
        };
        Reply::Done {
            status: Status::SUCCESS,
            dw0: value as u32,
            dw1: (value >> 32) as u32,
            data: Vec::new(),
        }
    }

    fn property_set(&self, p: &PropertyCmd) -> Reply {
        if p.offset != property::CC || p.wide {
            return Reply::status(Status::INVALID_FIELD);
        }
        let cc = p.value as u32;
        let mut st = self.state.lock().expect("controller state");
        let was = st.cc;
        st.cc = cc;
        let enable = cc & property::CC_EN != 0 && was & property::CC_EN == 0;
        let disable = cc & property::CC_EN == 0 && was & property::CC_EN != 0;
        let shutdown = cc & property::CC_SHN_MASK != 0 && was & property::CC_SHN_MASK == 0;
        if enable {
            // Enable: I/O controllers need 64-byte SQEs and 16-byte CQEs.
            let (iosqes, iocqes) = ((cc >> 16) & 0xf, (cc >> 20) & 0xf);
            if !self.subsys.is_discovery() && (iosqes != 6 || iocqes != 4) {
                tracing::warn!(
                    cntlid = self.cntlid,
                    cc,
                    "CC.EN with IOSQES {iosqes} / IOCQES {iocqes}: fatal status"
                );
                st.csts = property::CSTS_CFS;
            } else {
                st.csts = property::CSTS_RDY;
                st.disabled_since = None;
                drop(st);
                self.keep_alive();
                tracing::debug!(cntlid = self.cntlid, "controller enabled");
                return Reply::ok(0);
            }
        }
        if disable || shutdown {
            // A controller reset (CC.EN 1 -> 0) or a shutdown: the I/O queues
            // are deleted and their commands aborted (NVMe Base 2.0, 3.7.2;
            // NVMe over Fabrics 1.1, 3.5); the admin queue stays, and the
            // host has `enable_timeout` to enable the controller again.
            self.generation.fetch_add(1, Ordering::AcqRel);
            // Held AERs are aborted by their queue, which sees the new
            // generation; events not yet reported go with them.
            st.events = Events::default();
            st.connected.iter_mut().for_each(|c| *c = false);
            st.csts &= !property::CSTS_RDY;
            st.disabled_since = Some(Instant::now());
            st.acre = false;
            if disable {
                st.csts &= !(property::CSTS_CFS | 3 << property::CSTS_SHST_SHIFT);
                tracing::info!(cntlid = self.cntlid, host = %self.hostnqn, "controller reset by the host (CC.EN 1 -> 0): I/O queues deleted");
            }
        }
        if shutdown {
            st.csts = (st.csts & !(3 << property::CSTS_SHST_SHIFT)) | property::CSTS_SHST_COMPLETE;
            tracing::info!(cntlid = self.cntlid, host = %self.hostnqn, "host shut the controller down");
        }
        Reply::ok(0)
    }
}
