//! What an operation tells the workers: a request's [`Decision`] on arrival, and [`Notice`]s for
//! requests of some worker that must now be resumed or answered (with their mailbox codec).

use crate::codec::{CodecError, Reader, Writer};
use crate::fairqueuing::{Receipt, RejectReason, RequestId};
use crate::Nanos;

/// What happened to an arriving request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Seats taken; let the request through now. Keep the receipt to finish it.
    Execute(Receipt),
    /// Waiting in a queue; hold the request until a [`Notice`] says otherwise.
    Queued(RequestId),
    /// Answer 429 with this `Retry-After`.
    Rejected { reason: RejectReason, retry_after: i64 },
}

/// Something a worker must do for one of its paused requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notice {
    pub owner: u32,
    pub context: u32,
    pub level_key: String,
    pub id: RequestId,
    pub kind: NoticeKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoticeKind {
    /// Dispatched: resume it (and keep the receipt to finish it).
    Run { waited: Nanos, receipt: Receipt },
    /// Gave up waiting: answer 429.
    Reject { reason: RejectReason, retry_after: i64 },
}

impl Notice {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(32 + self.level_key.len());
        w.u32(self.owner);
        w.u32(self.context);
        w.str(&self.level_key);
        w.u64(self.id);
        match self.kind {
            NoticeKind::Run { waited, receipt } => {
                w.u8(0);
                w.i64(waited);
                receipt.encode(&mut w);
            }
            NoticeKind::Reject { reason, retry_after } => {
                w.u8(1);
                w.u8(reason.code());
                w.i64(retry_after);
            }
        }
        w.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Notice, CodecError> {
        let mut r = Reader::new(bytes);
        let owner = r.u32()?;
        let context = r.u32()?;
        let level_key = r.str()?.to_string();
        let id = r.u64()?;
        let kind = match r.u8()? {
            0 => NoticeKind::Run { waited: r.i64()?, receipt: Receipt::decode(&mut r)? },
            1 => NoticeKind::Reject { reason: RejectReason::from_code(r.u8()?).ok_or(CodecError("reason"))?, retry_after: r.i64()? },
            _ => return Err(CodecError("notice kind")),
        };
        Ok(Notice { owner, context, level_key, id, kind })
    }
}
