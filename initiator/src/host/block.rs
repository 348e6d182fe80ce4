//! Block commands of the NVM command set, as the front-ends issue them.

use rdmablk_common::nvme::{nvm, Sqe};

/// Length of one Dataset Management range.
pub const DSM_RANGE_LEN: usize = 16;

/// The command `op` (READ, WRITE, WRITE_ZEROES, FLUSH, or DSM with one
/// deallocate range) for `blocks` blocks at `lba` of namespace `nsid`.
/// `flag` is FUA for WRITE and deallocate for WRITE_ZEROES.
pub fn sqe(op: u8, nsid: u32, lba: u64, blocks: u64, flag: bool) -> Sqe {
    let mut sqe = Sqe::new(op, 0);
    sqe.set_nsid(nsid);
    match op {
        nvm::DSM => sqe.set_cdw(11, 1 << 2), // one range (NR 0), deallocate
        nvm::FLUSH => {}
        _ => {
            sqe.set_cdw(10, lba as u32);
            sqe.set_cdw(11, (lba >> 32) as u32);
            let extra = match (op, flag) {
                (nvm::WRITE, true) => 1 << 30,
                (nvm::WRITE_ZEROES, true) => 1 << 25,
                _ => 0,
            };
            sqe.set_cdw(12, (blocks.max(1) - 1) as u32 | extra);
        }
    }
    sqe
}

/// Writes one Dataset Management range (no attributes) into `out`.
pub fn dsm_range(out: &mut [u8], lba: u64, blocks: u32) {
    out[..4].fill(0);
    out[4..8].copy_from_slice(&blocks.to_le_bytes());
    out[8..16].copy_from_slice(&lba.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_land_where_the_spec_puts_them() {
        let s = sqe(nvm::WRITE, 3, 0x1_0000_0002, 8, true);
        assert_eq!(s.opcode(), nvm::WRITE);
        assert_eq!(s.nsid(), 3);
        assert_eq!(s.cdw(10), 2);
        assert_eq!(s.cdw(11), 1);
        assert_eq!(s.cdw(12), 7 | 1 << 30);
        assert_eq!(sqe(nvm::WRITE_ZEROES, 1, 0, 1, true).cdw(12), 1 << 25);
        assert_eq!(sqe(nvm::DSM, 1, 0, 1, true).cdw(11), 1 << 2);
        let mut r = [0xffu8; 16];
        dsm_range(&mut r, 0x0102, 9);
        assert_eq!(r, [0, 0, 0, 0, 9, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]);
    }
}
