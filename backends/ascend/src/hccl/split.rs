//! [`unihal_hal::Communicator::split`] for HCCL, which has no split of its own: emulated with two
//! all-gathers on the parent and one `HcclCommInitRootInfo` per new communicator.
//!
//! 1. **The requests**: every rank of the parent posts its `(color, key)` (three `i32`: whether
//!    it has a color, the color, the key) to an all-gather on the parent, on a stream of its
//!    own on its device, and reads the result back; each rank then places every rank with
//!    [`unihal_hal::ccl::split_place`], the rule of every engine (by key, then old rank).
//! 2. **The root infos**: the leader of each color (its new rank 0) makes a root info
//!    (`HcclGetRootInfo`, with its device current), and a second all-gather on the parent hands
//!    every rank the 4108-byte slot of each rank (leaders' root infos, zeros from the others);
//!    each member keeps its leader's. When no rank has a color, the second all-gather is left
//!    out (every rank knows it from the requests).
//! 3. **The communicators**: each member makes its own with `HcclCommInitRootInfo(group size,
//!    leader's root info, new rank)` exactly as `init_rank` does (a helper thread with the
//!    device current, bounded by the child's timeout: `config`'s, else the parent's). The child
//!    keeps the rank's device and the parent's capabilities; its in-process ranks form a group
//!    of their own (keyed by the leader's root info), so a failure there ends posted operations
//!    through stand-ins as for every HCCL communicator.
//!
//! Both all-gathers are ordinary operations of the parent: they are watched, time out at the
//! parent's timeout, and count in the parent's order of operations (a split is a collective
//! call). A rank that fails before it posted both (no stream, no memory, a failed copy) would
//! leave its peers waiting inside a collective it never posts, so it fails the parent, as a
//! timeout would (its in-process peers end at once, with `Aborted`). A leader whose
//! `HcclGetRootInfo` fails still takes part with zeros: it returns HCCL's error, the members of
//! its color `Aborted` naming it, and the parent and the other colors go on. A color is any
//! `u32` (no C `int` lies in between, unlike `ncclCommSplit`'s and `MPI_Comm_split`'s).

use super::comm::{HcclComm, Parts};
use super::ffi::{RootInfo, ROOT_INFO_BYTES};
use super::group::Group;
use super::{init_comm, root_info};
use std::sync::Arc;
use unihal_hal::ccl::split_place;
use unihal_hal::{Buffer, CommConfig, Communicator, DType, HalError, Result, Stream};
use unihal_nccl_api::platform::with_current;

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

impl HcclComm {
    /// [`Communicator::split`], emulated (see the module's documentation).
    pub(super) fn split_emulated(
        &self,
        color: Option<u32>,
        key: i32,
        config: &CommConfig,
    ) -> Result<Option<Arc<dyn Communicator>>> {
        let s = &self.shared;
        if let Some(e) = s.sticky.lock().clone() {
            return Err(e);
        }
        if s.stopped() {
            return Err(s.stopped_error());
        }
        let timeout = config.timeout.unwrap_or(s.timeout);
        let x = self.exchange(color, key).inspect_err(|e| {
            // Peers wait in (or will post) an all-gather this rank may not have posted: the
            // parent's order of operations is broken. A parent that failed already stays as it
            // is (failing is once per group).
            s.fail(e.clone());
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
                    "split: rank {leader}, the leader of color {color}, could not make a root \
                     info (HcclGetRootInfo failed there): color {color} has no communicator"
                ),
            });
        }
        let root: Arc<RootInfo> = Arc::from(RootInfo::from_bytes(&slot).ok_or_else(|| {
            HalError::Internal(format!("split: a root info slot of {} bytes", slot.len()))
        })?);
        let group = Group::of(&slot, size);
        group.arrive(rank);
        // Sizes fit HCCL's `uint32_t`: the parent's did.
        let raw = init_comm(
            &s.platform,
            &s.lib,
            &root,
            (size as u32, rank as u32),
            &s.device,
            timeout,
        )?;
        Ok(Some(HcclComm::new(
            Parts {
                lib: s.lib.clone(),
                platform: s.platform.clone(),
                raw: raw as super::ffi::Comm,
                rank,
                size,
                device: s.device.clone(),
                caps: self.caps.clone(),
                group,
            },
            &CommConfig {
                timeout: Some(timeout),
            },
        )))
    }

    fn scratch(&self) -> Result<Scratch> {
        let (dev, n) = (&self.shared.device, self.shared.size);
        Ok(Scratch {
            stream: dev.create_stream()?,
            ask_send: dev.alloc(ASK_BYTES)?,
            ask_recv: dev.alloc(ASK_BYTES * n)?,
            root_send: dev.alloc(ROOT_INFO_BYTES)?,
            root_recv: dev.alloc(ROOT_INFO_BYTES * n)?,
        })
    }

    /// Steps 1 and 2: the requests, then the leaders' root infos, through the parent.
    fn exchange(&self, color: Option<u32>, key: i32) -> Result<Exchanged> {
        let s = &self.shared;
        let (n, me) = (s.size, s.rank);
        let x = self.scratch()?;
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
        let mut slot = vec![0u8; ROOT_INFO_BYTES];
        if leader == Some(me) {
            match with_current(&*s.platform, &s.device, "HcclGetRootInfo", || {
                root_info(&s.lib)
            }) {
                Ok(r) => slot = r.bytes(),
                Err(e) => out.own = Some(e),
            }
        }
        st.write(&x.root_send, 0, &slot)?;
        self.all_gather(
            &x.root_send,
            &x.root_recv,
            ROOT_INFO_BYTES as u64,
            DType::U8,
            st,
        )?;
        match leader {
            Some(q) => {
                st.read(&x.root_recv, (q * ROOT_INFO_BYTES) as u64, &mut slot)?;
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
