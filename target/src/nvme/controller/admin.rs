//! The admin command set: an enabled controller hands Identify, Get Log
//! Page and the features to their modules and answers Keep Alive,
//! Asynchronous Event Request and Abort itself.

use super::{Controller, Reply};
use rdmablk_common::nvme::{admin, property, Sqe, Status};

impl Controller {
    /// An admin command with the data the host sent for it.
    pub fn admin(&self, sqe: &Sqe, data: &[u8]) -> Reply {
        let enabled = self.state.lock().expect("controller state").csts & property::CSTS_RDY != 0;
        if !enabled {
            return Reply::status(Status::COMMAND_SEQUENCE_ERROR);
        }
        match sqe.opcode() {
            admin::IDENTIFY => self.identify(sqe),
            admin::GET_LOG_PAGE => self.get_log_page(sqe),
            admin::SET_FEATURES => self.set_features(sqe, data),
            admin::GET_FEATURES => self.get_features(sqe),
            admin::KEEP_ALIVE => {
                self.keep_alive();
                Reply::ok(0)
            }
            admin::ASYNC_EVENT => Reply::Held,
            // Not aborted (bit 0 set): commands here complete quickly anyway.
            admin::ABORT => Reply::ok(1),
            _ => Reply::status(Status::INVALID_OPCODE),
        }
    }
}
