//! Log page identifiers and the Get Log Page command's fields.

use super::Sqe;

/// Log page identifiers.
pub mod lid {
    pub const SUPPORTED: u8 = 0x00;
    pub const ERROR: u8 = 0x01;
    pub const SMART: u8 = 0x02;
    pub const FW_SLOT: u8 = 0x03;
    pub const CHANGED_NS: u8 = 0x04;
    pub const CMD_EFFECTS: u8 = 0x05;
    pub const ANA: u8 = 0x0c;
    /// Feature Identifiers Supported and Effects.
    pub const FEATURES: u8 = 0x12;
    /// NVMe-MI Commands Supported and Effects.
    pub const MI_EFFECTS: u8 = 0x13;
    pub const DISCOVERY: u8 = 0x70;
    pub const RESERVATION: u8 = 0x80;
}

/// Bits of an entry of the Supported Log Pages, Commands Supported and
/// Effects and Feature Identifiers Supported and Effects logs (NVMe Base
/// 2.0, Figures 204, 210 and 245).
pub mod entry {
    /// Supported (LSUPP, CSUPP, FSUPP).
    pub const SUPPORTED: u32 = 1;
    /// The command or feature may change logical block content (LBCC, UDCC).
    pub const CHANGES_DATA: u32 = 1 << 1;
    /// Scope: namespaces (CSP / FSP bit 0).
    pub const SCOPE_NAMESPACE: u32 = 1 << 20;
    /// Scope: the controller (CSP / FSP bit 1).
    pub const SCOPE_CONTROLLER: u32 = 1 << 21;
}

/// Get Log Page parameters decoded from a command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogRequest {
    pub lid: u8,
    /// Log Specific Parameter (for the ANA log, bit 0: Return Groups Only).
    pub lsp: u8,
    /// Retain Asynchronous Event.
    pub rae: bool,
    /// Bytes requested.
    pub len: usize,
    /// Byte offset into the log page.
    pub offset: u64,
}

impl LogRequest {
    pub fn from_sqe(sqe: &Sqe) -> Self {
        let cdw10 = sqe.cdw(10);
        let numd = ((sqe.cdw(11) as u64 & 0xffff) << 16) | (cdw10 >> 16) as u64;
        LogRequest {
            lid: cdw10 as u8,
            lsp: (cdw10 >> 8) as u8 & 0xf,
            rae: cdw10 & (1 << 15) != 0,
            len: ((numd + 1) * 4) as usize,
            offset: sqe.cdw(12) as u64 | (sqe.cdw(13) as u64) << 32,
        }
    }

    /// Fills `sqe` to request `len` bytes of log `lid` from `offset`.
    pub fn to_sqe(&self, sqe: &mut Sqe) {
        let numd = (self.len / 4).saturating_sub(1) as u32;
        sqe.set_cdw(
            10,
            self.lid as u32
                | (self.lsp as u32 & 0xf) << 8
                | if self.rae { 1 << 15 } else { 0 }
                | (numd & 0xffff) << 16,
        );
        sqe.set_cdw(11, numd >> 16);
        sqe.set_cdw(12, self.offset as u32);
        sqe.set_cdw(13, (self.offset >> 32) as u32);
    }

    /// The part of a complete log page that the request covers. It may be
    /// shorter than `len`: the bytes past the page's end read as zero, and
    /// the transport pads them (so a huge NUMD allocates nothing).
    pub fn window(&self, page: &[u8]) -> Vec<u8> {
        let off = usize::try_from(self.offset)
            .unwrap_or(usize::MAX)
            .min(page.len());
        page[off..][..(page.len() - off).min(self.len)].to_vec()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numd_spans_two_dwords() {
        let req = LogRequest {
            lid: lid::DISCOVERY,
            lsp: 0,
            rae: false,
            len: 0x40000 * 4,
            offset: 1024,
        };
        let mut sqe = Sqe::new(0x02, 1);
        req.to_sqe(&mut sqe);
        assert_eq!(sqe.cdw(10), 0x70 | 0xffff << 16);
        assert_eq!(sqe.cdw(11), 3);
        assert_eq!(LogRequest::from_sqe(&sqe), req);
        assert_eq!(
            req.window(&[1, 2, 3]),
            Vec::<u8>::new(),
            "offset past the page"
        );
        let whole = LogRequest { offset: 1, ..req };
        assert_eq!(whole.window(&[1, 2, 3]), vec![2, 3]);
    }
}
