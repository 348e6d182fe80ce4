//! Safe wrappers over the RDMA verbs and connection manager (rdma-sys is
//! named nowhere else), and the NVMe/RDMA CM private data.

pub mod cm;
pub mod private_data;
pub mod verbs;

pub use cm::{CmChannel, CmEvent, CmEventKind, CmId, ConnParam, NewId, QpConfig};
pub use verbs::{
    access, device_names, next_rkey, CompChannel, Completion, Cq, Device, DeviceAttrs, Mr, Mw, Pd,
    SendOp, SendWr, Sge, Srq,
};

/// The message for `-t rdma` / `rdma://` on a machine without RDMA devices.
pub fn no_device_message() -> String {
    "no RDMA device found: NVMe/RDMA needs an RDMA NIC, or a software device \
     such as soft-RoCE on an Ethernet interface (modprobe rdma_rxe; \
     rdma link add rxe0 type rxe netdev eth0)"
        .to_string()
}

/// Fails at once when the machine has no RDMA device.
pub fn require_device() -> std::io::Result<()> {
    if device_names().is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            no_device_message(),
        ));
    }
    Ok(())
}
