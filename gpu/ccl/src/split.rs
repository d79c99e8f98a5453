//! [`unihal_hal::Communicator::split`] for a library without a split of its own (HCCL; an NCCL
//! older than 2.18): emulated with two all-gathers on the parent and one blocking init per new
//! communicator.
//!
//! 1. **The requests**: every rank of the parent posts its `(color, key)` (three `i32`: whether
//!    it has a color, the color, the key) to an all-gather on the parent, on a stream of its
//!    own on its device, and reads the result back; each rank then places every rank with
//!    [`unihal_hal::ccl::split_place`], the rule of every engine (by key, then old rank).
//! 2. **The unique ids**: the leader of each color (its new rank 0) makes a unique id (with its
//!    device current), and a second all-gather on the parent hands every rank the id-sized slot
//!    of each rank (leaders' ids, zeros from the others); each member keeps its leader's. When
//!    no rank has a color, the second all-gather is left out (every rank knows it from the
//!    requests).
//! 3. **The communicators**: each member makes its own with the library's init (group size,
//!    leader's id, new rank) exactly as `init_rank` does (a helper thread with the device
//!    current, bounded by the child's timeout: `config`'s, else the parent's). The child keeps
//!    the rank's device and the parent's capabilities; its in-process ranks form a group of their
//!    own (keyed by the leader's id), so a failure there ends posted operations through
//!    stand-ins as for every communicator of a library without an abort.
//!
//! Both all-gathers are ordinary operations of the parent: they are watched, time out at the
//! parent's timeout, and count in the parent's order of operations (a split is a collective
//! call). A rank that fails before it posted both (no stream, no memory, a failed copy) would
//! leave its peers waiting inside a collective it never posts, so it fails the parent, as a
//! timeout would (its in-process peers end at once, with `Aborted`). A leader whose unique id
//! fails still takes part with zeros: it returns the library's error, the members of its color
//! `Aborted` naming it, and the parent and the other colors go on. A color is any `u32` (no C
//! `int` lies in between, unlike `ncclCommSplit`'s and `MPI_Comm_split`'s).

use crate::comm::{LibComm, Parts};
use crate::engine::init_rank_bounded;
use crate::group::Group;
use crate::library::CollectiveLib;
use crate::platform::with_current;
use std::sync::Arc;
use std::time::Duration;
use unihal_hal::ccl::split_place;
use unihal_hal::{Buffer, CommConfig, Communicator, DType, HalError, Result, Stream};

/// One rank's request as posted: three `i32` (has a color, the color's bits, the key).
const ASK_ELEMS: u64 = 3;
const ASK_BYTES: usize = 12;

fn encode_ask(color: Option<u32>, key: i32) -> [u8; ASK_BYTES] {
    let mut b = [0u8; ASK_BYTES];
    b[..4].copy_from_slice(&i32::from(color.is_some()).to_le_bytes());
    b[4..8].copy_from_slice(&color.unwrap_or(0).to_le_bytes());
    b[8..].copy_from_slice(&key.to_le_bytes());
    b
}

fn decode_ask(b: &[u8]) -> (Option<u32>, i32) {
    let word = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
    let has = i32::from_le_bytes(word(0)) != 0;
    let color = u32::from_le_bytes(word(4));
    (has.then_some(color), i32::from_le_bytes(word(8)))
}

/// What the exchange on the parent gave this rank.
struct Exchanged {
    /// Every rank's `(color, key)`, by old rank.
    asks: Vec<(Option<u32>, i32)>,
    /// This rank's leader (its old rank) and the slot it posted; None without a color.
    leader: Option<(usize, Vec<u8>)>,
    /// This rank leads its color and could not make a root info.
    own: Option<HalError>,
}

/// The device memory and stream of one rank's exchange, all taken before the first all-gather.
struct Scratch {
    stream: Arc<dyn Stream>,
    ask_send: Buffer,
    ask_recv: Buffer,
    root_send: Buffer,
    root_recv: Buffer,
}

impl<L: CollectiveLib> LibComm<L> {
    /// [`Communicator::split`], emulated (see the module's documentation); the parent was
    /// checked open.
    pub(crate) fn split_emulated(
        &self,
        color: Option<u32>,
        key: i32,
        timeout: Duration,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        let s = self.split_parts();
        let label = s.lib.label();
        let x = self.exchange(color, key).inspect_err(|e| {
            // Peers wait in (or will post) an all-gather this rank may not have posted: the
            // parent's order of operations is broken. A parent that failed already stays as it
            // is (failing is once per group).
            self.fail(e.clone());
        })?;
        let Some(color) = color else {
            return Ok(None);
        };
        let (rank, size) = split_place(&x.asks, s.rank).ok_or_else(|| {
            HalError::Internal(format!(
                "split: rank {} has color {color} but no place among {:?}",
                s.rank, x.asks
            ))
        })?;
        if let Some(e) = x.own {
            return Err(e);
        }
        let (leader, slot) = x
            .leader
            .ok_or_else(|| HalError::Internal(format!("split: color {color} has no leader")))?;
        if slot.iter().all(|&b| b == 0) {
            return Err(HalError::Aborted {
                what: format!(
                    "split: rank {leader}, the leader of color {color}, could not make a {label} \
                     unique id there: color {color} has no communicator"
                ),
            });
        }
        let group = (!s.lib.can_abort()).then(|| Group::of(label, &slot, size));
        if let Some(g) = &group {
            g.arrive(rank);
        }
        let raw = init_rank_bounded(s.platform, s.lib, &slot, (size, rank), s.device, timeout)?;
        Ok(Some(LibComm::new(
            Parts {
                lib: s.lib.clone(),
                platform: s.platform.clone(),
                raw,
                rank,
                size,
                device: s.device.clone(),
                caps: s.caps.clone(),
                group,
            },
            &CommConfig {
                timeout: Some(timeout),
            },
        )))
    }

    fn scratch(&self, id_bytes: usize) -> Result<Scratch> {
        let s = self.split_parts();
        let (dev, n) = (s.device, s.size);
        Ok(Scratch {
            stream: dev.create_stream()?,
            ask_send: dev.alloc(ASK_BYTES)?,
            ask_recv: dev.alloc(ASK_BYTES * n)?,
            root_send: dev.alloc(id_bytes)?,
            root_recv: dev.alloc(id_bytes * n)?,
        })
    }

    /// Steps 1 and 2: the requests, then the leaders' unique ids, through the parent.
    fn exchange(&self, color: Option<u32>, key: i32) -> Result<Exchanged> {
        let s = self.split_parts();
        let (n, me) = (s.size, s.rank);
        let id_bytes = s.lib.id_kind().1;
        let x = self.scratch(id_bytes)?;
        let st = &x.stream;
        st.write(&x.ask_send, 0, &encode_ask(color, key))?;
        self.all_gather(&x.ask_send, &x.ask_recv, ASK_ELEMS, DType::I32, st)?;
        let mut all = vec![0u8; ASK_BYTES * n];
        st.read(&x.ask_recv, 0, &mut all)?;
        let asks: Vec<(Option<u32>, i32)> = all.chunks(ASK_BYTES).map(decode_ask).collect();
        if asks.get(me) != Some(&(color, key)) {
            return Err(HalError::Internal(format!(
                "split: rank {me} asked for {:?} and the all-gather gave back {:?}",
                (color, key),
                asks.get(me)
            )));
        }
        let mut out = Exchanged {
            leader: None,
            own: None,
            asks: Vec::new(),
        };
        if asks.iter().all(|a| a.0.is_none()) {
            out.asks = asks;
            return Ok(out);
        }
        // Each color's leader: its member of new rank 0.
        let leader = color.and_then(|c| {
            (0..n).find(|&q| asks[q].0 == Some(c) && split_place(&asks, q).map(|p| p.0) == Some(0))
        });
        let mut slot = vec![0u8; id_bytes];
        if leader == Some(me) {
            match with_current(&**s.platform, s.device, "unique id", || s.lib.unique_id()) {
                Ok(id) if id.len() == id_bytes => slot = id,
                Ok(id) => {
                    out.own = Some(HalError::Internal(format!(
                        "{} made a unique id of {} bytes, not {id_bytes}",
                        s.lib.label(),
                        id.len()
                    )))
                }
                Err(e) => out.own = Some(e),
            }
        }
        st.write(&x.root_send, 0, &slot)?;
        self.all_gather(&x.root_send, &x.root_recv, id_bytes as u64, DType::U8, st)?;
        match leader {
            Some(q) => {
                st.read(&x.root_recv, (q * id_bytes) as u64, &mut slot)?;
                out.leader = Some((q, slot));
            }
            None => st.synchronize()?,
        }
        out.asks = asks;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_with_every_color_and_key() {
        for ask in [
            (None, 0),
            (Some(0), -1),
            (Some(u32::MAX), i32::MIN),
            (Some(7), i32::MAX),
        ] {
            assert_eq!(decode_ask(&encode_ask(ask.0, ask.1)), ask);
        }
    }
}
