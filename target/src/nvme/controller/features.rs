//! Set Features and Get Features: the number of I/O queues, keep-alive,
//! Host Behavior Support (Advanced Command Retry), the Host Identifier, and
//! the features kept only to be read back.

use super::{Controller, Reply, MAX_IO_QUEUES};
use rdmablk_common::nvme::{feature, Sqe, Status, HOST_BEHAVIOR_LEN};
use std::sync::atomic::Ordering;

/// Size of the Host Identifier feature's data (the extended, 128-bit one).
pub(super) const HOST_ID_LEN: usize = 16;

impl Controller {
    /// Set Features: the value in CDW11, or `data` for Host Behavior Support.
    pub(super) fn set_features(&self, sqe: &Sqe, data: &[u8]) -> Reply {
        let cdw10 = sqe.cdw(10);
        let fid = cdw10 as u8;
        let value = sqe.cdw(11);
        if cdw10 & (1 << 31) != 0 {
            return Reply::status(Status::FEATURE_NOT_SAVEABLE);
        }
        match fid {
            feature::RESV_MASK => return self.set_reservation_mask(sqe),
            feature::RESV_PERSIST => return self.set_reservation_persistence(sqe),
            _ => {}
        }
        let mut st = self.state.lock().expect("controller state");
        match fid {
            feature::NUM_QUEUES => {
                let (nsqr, ncqr) = (value & 0xffff, value >> 16);
                if nsqr == 0xffff || ncqr == 0xffff {
                    return Reply::status(Status::INVALID_FIELD);
                }
                // NVMe Base 2.0, 5.27.1.5: only before I/O queues exist.
                if st.connected.iter().any(|&c| c) {
                    return Reply::status(Status::COMMAND_SEQUENCE_ERROR);
                }
                let granted = (nsqr.min(ncqr) + 1).min(MAX_IO_QUEUES as u32) as u16;
                st.io_queues = granted;
                let g = (granted - 1) as u32;
                Reply::ok(g << 16 | g)
            }
            feature::KEEP_ALIVE => {
                // A discovery controller keeps a deadline (as at Connect).
                let value = match value {
                    0 if self.subsys.is_discovery() => self
                        .registry
                        .admission
                        .limits
                        .discovery_keep_alive
                        .as_millis() as u32,
                    v => v,
                };
                self.kato_ms.store(value, Ordering::Release);
                drop(st);
                self.keep_alive();
                Reply::ok(0)
            }
            feature::HOST_BEHAVIOR => match data.first() {
                // ACRE: 0 or 1; the other fields stay 0 (not supported).
                Some(&acre @ (0 | 1)) if data.len() >= HOST_BEHAVIOR_LEN => {
                    st.acre = acre == 1;
                    Reply::ok(0)
                }
                _ => Reply::status(Status::INVALID_FIELD),
            },
            feature::ASYNC_EVENT
            | feature::ARBITRATION
            | feature::POWER_MGMT
            | feature::TEMP_THRESHOLD
            | feature::ERROR_RECOVERY
            | feature::VOLATILE_WC
            | feature::IRQ_COALESCE
            | feature::WRITE_ATOMIC => {
                st.features.insert(fid, value);
                Reply::ok(0)
            }
            _ => Reply::status(Status::INVALID_FIELD),
        }
    }

    /// Get Features: the value in dword 0, or the feature's data.
    pub(super) fn get_features(&self, sqe: &Sqe) -> Reply {
        let fid = sqe.cdw(10) as u8;
        match fid {
            feature::RESV_MASK => return self.get_reservation_mask(sqe),
            feature::RESV_PERSIST => return self.get_reservation_persistence(sqe),
            _ => {}
        }
        let st = self.state.lock().expect("controller state");
        match fid {
            feature::NUM_QUEUES => {
                let g = st.io_queues.max(1) as u32 - 1;
                Reply::ok(g << 16 | g)
            }
            feature::KEEP_ALIVE => Reply::ok(self.kato_ms.load(Ordering::Acquire)),
            feature::VOLATILE_WC => Reply::ok(
                st.features
                    .get(&fid)
                    .copied()
                    .unwrap_or(self.subsys.volatile_cache() as u32),
            ),
            feature::HOST_ID => Reply::data(self.hostid.to_vec()),
            feature::HOST_BEHAVIOR => {
                let mut b = vec![0u8; HOST_BEHAVIOR_LEN];
                b[0] = st.acre as u8;
                Reply::data(b)
            }
            feature::ASYNC_EVENT
            | feature::ARBITRATION
            | feature::POWER_MGMT
            | feature::TEMP_THRESHOLD
            | feature::ERROR_RECOVERY
            | feature::IRQ_COALESCE
            | feature::WRITE_ATOMIC => Reply::ok(st.features.get(&fid).copied().unwrap_or(0)),
            _ => Reply::status(Status::INVALID_FIELD),
        }
    }
}
