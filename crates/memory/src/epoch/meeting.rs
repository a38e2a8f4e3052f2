//! A population's members in lockstep: each member trains on a thread and a stream of its own,
//! and hands each epoch's launch to a meeting point instead of launching it; the last member to
//! arrive launches every waiting member's epoch at once ([`super::EpochPopulation`]'s launches),
//! so that a population's training epoch is one launch, not one a member.
//!
//! Who meets: the members seated ([`EpochMeeting::join`]) and not yet gone (their [`Seat`]
//! dropped: done, failed or stopped). A member seated late meets the others from its next
//! launch on; one busy elsewhere (evaluating, checkpointing) is waited for. Which members share
//! a launch never changes a member's result: each equals its agent trained alone, bit for bit,
//! in any company and with any number of blocks.
//!
//! Streams: a member's work before its launch is marked by an event its part carries; the
//! launching thread's stream waits for all of them, launches, and marks the launches with an
//! event that every member's stream waits for before [`Seat::launch`] returns, so whatever a
//! member queues next (reading its statistics, freeing its buffers) runs after them.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use foxhunt_gpu::{GpuContext, GpuEvent};

use super::{EpochMember, PreparedMember, Tables, launch_all};
use crate::MemoryError;

/// The meeting point of one window's population.
pub struct EpochMeeting {
    state: Mutex<State>,
    turn: Condvar,
}

struct State {
    /// Members seated.
    seated: usize,
    /// The parts handed in for the round, each with the event after its member's prior work.
    waiting: Vec<(PreparedMember, GpuEvent)>,
    /// Rounds launched so far.
    round: u64,
    /// The last round's outcome: the event after its launches, or why they failed.
    outcome: Result<Arc<GpuEvent>, String>,
    /// The launches' tables, made by the first launching member.
    tables: Option<Tables>,
    /// Members launched in each round.
    sizes: Vec<usize>,
}

impl Default for EpochMeeting {
    fn default() -> Self {
        Self::new()
    }
}

impl EpochMeeting {
    /// A meeting point with no one seated.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                seated: 0,
                waiting: Vec::new(),
                round: 0,
                outcome: Err("no round yet".into()),
                tables: None,
                sizes: Vec::new(),
            }),
            turn: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A member that panicked while holding the lock left the counts consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A member's seat: it meets the others until the seat is dropped.
    pub fn join(&self) -> Seat<'_> {
        self.lock().seated += 1;
        Seat(self)
    }

    /// How many members each round launched, in order.
    pub fn rounds(&self) -> Vec<usize> {
        self.lock().sizes.clone()
    }

    /// Launches the waiting parts on `ctx`'s stream and opens the next round.
    fn launch_round(s: &mut State, ctx: &GpuContext) {
        let waiting = std::mem::take(&mut s.waiting);
        let n = waiting.len();
        let tables = &mut s.tables;
        let outcome = (|| -> Result<GpuEvent, MemoryError> {
            for (_, ready) in &waiting {
                ctx.wait(ready)?;
            }
            if tables.is_none() {
                *tables = Some(Tables::new(ctx)?);
            }
            let parts: Vec<PreparedMember> = waiting.into_iter().map(|(p, _)| p).collect();
            // SAFETY: every part's member is blocked in `Seat::launch`, holding the borrows of
            // the buffers its part names, until this round's outcome is set; its stream then
            // waits for the event recorded below before it queues anything else. This stream
            // waited above for the work each member queued before its part.
            unsafe {
                launch_all(
                    ctx,
                    tables.as_mut().expect("made above"),
                    &parts,
                    usize::MAX,
                )
            }?;
            Ok(ctx.record()?)
        })();
        s.outcome = outcome.map(Arc::new).map_err(|e| e.to_string());
        s.sizes.push(n);
        s.round += 1;
    }
}

/// A member's seat at a meeting point; dropping it leaves (and, where the others were waiting
/// only for this member, lets them launch).
pub struct Seat<'a>(&'a EpochMeeting);

impl Seat<'_> {
    /// Hands `member`'s epoch (its buffers on `ctx`'s stream) to the round and returns once the
    /// round is launched, `ctx`'s stream then waiting for the launch. Blocks until every
    /// seated member has handed in its epoch (or left).
    pub fn launch(
        &self,
        ctx: &GpuContext,
        mut member: EpochMember<'_, '_>,
    ) -> Result<(), MemoryError> {
        let meeting = self.0;
        let part = member.prepare(ctx)?;
        let ready = ctx.record()?;
        let mut s = meeting.lock();
        s.waiting.push((part, ready));
        let mine = s.round;
        while s.round == mine {
            if s.waiting.len() >= s.seated {
                EpochMeeting::launch_round(&mut s, ctx);
                meeting.turn.notify_all();
                break;
            }
            s = meeting.turn.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        let outcome = s.outcome.clone();
        drop(s);
        match outcome {
            Ok(done) => Ok(ctx.wait(&done)?),
            Err(why) => Err(MemoryError::Launch(why)),
        }
        // `member`, and with it the borrows of its buffers, ends only here.
    }
}

impl Drop for Seat<'_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.seated -= 1;
        if !s.waiting.is_empty() && s.waiting.len() >= s.seated {
            // A waiting member launches the round (it has a stream; this one is leaving).
            self.0.turn.notify_all();
        }
    }
}
