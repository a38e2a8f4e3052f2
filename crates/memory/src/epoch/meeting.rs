//! A population's members in lockstep: each member trains on a thread and a stream of its own,
//! and hands each epoch's launch to a meeting point instead of launching it; the last member to
//! arrive launches every waiting member's epoch at once ([`super::EpochPopulation`]'s launches),
//! so that a population's training epoch is one launch, not one a member. Where the meeting has
//! an evaluator, members hand in their validations the same way ([`Seat::judge`]): the last to
//! arrive judges every waiting member's network in one evaluation (foxhunt-memory's
//! `DeviceEvaluator::judge_all`) instead of one whole-device evaluation a member, one after
//! another. A round is due when every seated member has handed something in; it runs the kind
//! most of them handed in (epochs or validations) and keeps the others' parts for the next
//! round. So members out of step (one seated late hands in an epoch while the others hand in
//! validations) fall back into step after one round instead of splitting every later round
//! between the two kinds; and since every round runs at least one part, no one waits forever.
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

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use foxhunt_env::{EnvConfig, Metrics};
use foxhunt_gpu::{GpuContext, GpuEvent};

use super::{EpochMember, PreparedMember, Tables, launch_all};
use crate::MemoryError;
use crate::eval::{DeviceEvaluator, MemberNet, NetOnDevice};

/// The meeting point of one window's population (`'w`: the window its evaluator reads).
pub struct EpochMeeting<'w> {
    state: Mutex<State<'w>>,
    turn: Condvar,
    /// The evaluator's environment, which never changes: asked about at every validation, so
    /// kept outside the lock that a running round holds.
    judged_env: Option<EnvConfig>,
}

/// What a member hands in for a round.
enum Part {
    /// Its epoch's launch (its words are many: boxed, so that a validation's part stays small).
    Epoch(Box<PreparedMember>),
    /// Its network's validation: the split and the capital it is judged with.
    Judge {
        net: MemberNet,
        split: Range<usize>,
        capital: f64,
    },
}

/// A part handed in and not yet run: its ticket, the part, and the event after its member's
/// prior work.
struct Waiting {
    ticket: u64,
    part: Part,
    ready: GpuEvent,
}

/// What a member gets back for its part.
enum Outcome {
    /// For an epoch: the event after its round's launches, or why they failed.
    Launched(Result<Arc<GpuEvent>, String>),
    /// For a validation: its metrics, or why they could not be had.
    Judged(Result<Metrics, String>),
}

struct State<'w> {
    /// Members seated.
    seated: usize,
    /// The parts handed in and not yet run.
    waiting: Vec<Waiting>,
    /// The next part's ticket.
    next_ticket: u64,
    /// Outcomes of parts run, by ticket, until their members take them.
    done: HashMap<u64, Outcome>,
    /// The launches' tables, made by the first launching member.
    tables: Option<Tables>,
    /// Where the members' validations are judged together, if they are.
    evaluator: Option<DeviceEvaluator<'w>>,
    /// Members launched in each round.
    sizes: Vec<usize>,
    /// Networks judged in each round that judged any.
    judge_sizes: Vec<usize>,
}

impl Default for EpochMeeting<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'w> EpochMeeting<'w> {
    /// A meeting point with no one seated, for the members' epochs only.
    pub fn new() -> Self {
        Self::make(None)
    }

    /// A meeting point for the members' epochs and their validations, judged by `evaluator`
    /// (for members in its environment: [`EpochMeeting::judges`]).
    pub fn with_evaluator(evaluator: DeviceEvaluator<'w>) -> Self {
        Self::make(Some(evaluator))
    }

    fn make(evaluator: Option<DeviceEvaluator<'w>>) -> Self {
        Self {
            judged_env: evaluator.as_ref().map(|e| e.env().clone()),
            state: Mutex::new(State {
                seated: 0,
                waiting: Vec::new(),
                next_ticket: 0,
                done: HashMap::new(),
                tables: None,
                evaluator,
                sizes: Vec::new(),
                judge_sizes: Vec::new(),
            }),
            turn: Condvar::new(),
        }
    }

    /// Whether a member in environment `env` may hand its validations in ([`Seat::judge`]).
    pub fn judges(&self, env: &EnvConfig) -> bool {
        self.judged_env.as_ref() == Some(env)
    }

    /// How many networks each round that judged any judged together, in order.
    pub fn judge_rounds(&self) -> Vec<usize> {
        self.lock().judge_sizes.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State<'w>> {
        // A member that panicked while holding the lock left the counts consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A member's seat: it meets the others until the seat is dropped.
    pub fn join(&self) -> Seat<'_, 'w> {
        self.lock().seated += 1;
        Seat(self)
    }

    /// How many members each round that launched epochs launched, in order.
    pub fn rounds(&self) -> Vec<usize> {
        self.lock().sizes.clone()
    }

    /// Runs a round: the waiting parts of the kind most of them are (epochs launched on `ctx`'s
    /// stream, validations judged on the evaluator's), their outcomes left for their members;
    /// the other parts wait for the next round.
    fn run_round(s: &mut State<'w>, ctx: &GpuContext) {
        let epochs_waiting = s
            .waiting
            .iter()
            .filter(|w| matches!(w.part, Part::Epoch(_)))
            .count();
        let run_epochs = 2 * epochs_waiting >= s.waiting.len();
        let (run, keep): (Vec<Waiting>, Vec<Waiting>) = std::mem::take(&mut s.waiting)
            .into_iter()
            .partition(|w| matches!(w.part, Part::Epoch(_)) == run_epochs);
        s.waiting = keep;
        if run_epochs {
            Self::launch_epochs(s, ctx, run);
        } else {
            Self::judge(s, run);
        }
    }

    /// Launches the epochs `run` together on `ctx`'s stream.
    fn launch_epochs(s: &mut State<'w>, ctx: &GpuContext, run: Vec<Waiting>) {
        let tickets: Vec<u64> = run.iter().map(|w| w.ticket).collect();
        let tables = &mut s.tables;
        let outcome = (|| -> Result<GpuEvent, MemoryError> {
            for w in &run {
                ctx.wait(&w.ready)?;
            }
            if tables.is_none() {
                *tables = Some(Tables::new(ctx)?);
            }
            let parts: Vec<PreparedMember> = run
                .into_iter()
                .map(|w| match w.part {
                    Part::Epoch(p) => *p,
                    Part::Judge { .. } => unreachable!("a round of epochs"),
                })
                .collect();
            // SAFETY: every part's member is blocked in `Seat::launch`, holding the borrows of
            // the buffers its part names, until it takes this round's outcome; its stream then
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
        let outcome = outcome.map(Arc::new).map_err(|e| e.to_string());
        s.sizes.push(tickets.len());
        for t in tickets {
            s.done.insert(t, Outcome::Launched(outcome.clone()));
        }
    }

    /// Judges the validations `run` on the evaluator's stream: networks of one shape over one
    /// split together, others in evaluations of their own (a sweep over hidden sizes).
    fn judge(s: &mut State<'w>, run: Vec<Waiting>) {
        s.judge_sizes.push(run.len());
        let mut left: Vec<(u64, MemberNet, Range<usize>, f64, GpuEvent)> = run
            .into_iter()
            .map(|w| match w.part {
                Part::Judge {
                    net,
                    split,
                    capital,
                } => (w.ticket, net, split, capital, w.ready),
                Part::Epoch(_) => unreachable!("a round of validations"),
            })
            .collect();
        let Some(evaluator) = s.evaluator.as_mut() else {
            for (t, ..) in left {
                let why = "this meeting has no evaluator".to_owned();
                s.done.insert(t, Outcome::Judged(Err(why)));
            }
            return;
        };
        while let Some(head) = left.first() {
            let (first, split, capital) = (head.1, head.2.clone(), head.3);
            let (group, rest): (Vec<_>, Vec<_>) = left.into_iter().partition(|j| {
                j.2 == split && j.3.to_bits() == capital.to_bits() && j.1.same_shape(&first)
            });
            left = rest;
            let nets: Vec<MemberNet> = group.iter().map(|j| j.1).collect();
            let metrics = (|| -> Result<Vec<Metrics>, MemoryError> {
                for j in &group {
                    evaluator.context().wait(&j.4)?;
                }
                evaluator.judge_members(&nets, split, capital)
            })();
            for (i, j) in group.iter().enumerate() {
                let judged = match &metrics {
                    Ok(m) => Ok(m[i].clone()),
                    Err(e) => Err(e.to_string()),
                };
                s.done.insert(j.0, Outcome::Judged(judged));
            }
        }
    }
}

/// A member's seat at a meeting point; dropping it leaves (and, where the others were waiting
/// only for this member, lets them launch).
pub struct Seat<'a, 'w>(&'a EpochMeeting<'w>);

impl<'w> Seat<'_, 'w> {
    /// Whether the meeting judges networks in environment `env` ([`Seat::judge`]).
    pub fn judges(&self, env: &EnvConfig) -> bool {
        self.0.judges(env)
    }

    /// Hands `member`'s epoch (its buffers on `ctx`'s stream) to the meeting and returns once a
    /// round has launched it, `ctx`'s stream then waiting for the launch. Blocks until then: a
    /// round is due when every seated member has handed something in (or left).
    pub fn launch(
        &self,
        ctx: &GpuContext,
        mut member: EpochMember<'_, '_>,
    ) -> Result<(), MemoryError> {
        let part = member.prepare(ctx)?;
        match self.meet(ctx, Part::Epoch(Box::new(part)))? {
            Outcome::Launched(Ok(done)) => Ok(ctx.wait(&done)?),
            Outcome::Launched(Err(why)) => Err(MemoryError::Launch(why)),
            Outcome::Judged(_) => unreachable!("an epoch's outcome"),
        }
        // `member`, and with it the borrows of its buffers, ends only here.
    }

    /// Hands the validation of `net` (queued on `ctx`'s stream) over `split` with `capital` to
    /// the round and returns its metrics, equal to `DeviceEvaluator::judge`'s of the network
    /// alone. Blocks as [`Seat::launch`]. For a member whose environment the meeting
    /// [`EpochMeeting::judges`] (else an error).
    pub fn judge(
        &self,
        ctx: &GpuContext,
        env: &EnvConfig,
        net: &NetOnDevice<'_>,
        split: Range<usize>,
        capital: f64,
    ) -> Result<Metrics, MemoryError> {
        if !self.0.judges(env) {
            return Err(MemoryError::Config(
                "this meeting does not judge networks in this environment".into(),
            ));
        }
        let part = Part::Judge {
            net: net.member(ctx),
            split,
            capital,
        };
        match self.meet(ctx, part)? {
            Outcome::Judged(Ok(m)) => Ok(m),
            Outcome::Judged(Err(why)) => Err(MemoryError::Launch(why)),
            Outcome::Launched(_) => unreachable!("a validation's outcome"),
        }
        // `net`, and with it the borrow of its parameters, ends only here: the round's
        // evaluation has been read back.
    }

    /// Hands `part` (after the work queued on `ctx`'s stream) to the meeting and waits until a
    /// round has run it: its outcome.
    fn meet(&self, ctx: &GpuContext, part: Part) -> Result<Outcome, MemoryError> {
        let meeting = self.0;
        let ready = ctx.record()?;
        let mut s = meeting.lock();
        let ticket = s.next_ticket;
        s.next_ticket += 1;
        s.waiting.push(Waiting {
            ticket,
            part,
            ready,
        });
        loop {
            if let Some(outcome) = s.done.remove(&ticket) {
                return Ok(outcome);
            }
            if s.waiting.len() >= s.seated {
                EpochMeeting::run_round(&mut s, ctx);
                meeting.turn.notify_all();
                continue;
            }
            s = meeting.turn.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Drop for Seat<'_, '_> {
    fn drop(&mut self) {
        let mut s = self.0.lock();
        s.seated -= 1;
        if !s.waiting.is_empty() && s.waiting.len() >= s.seated {
            // A waiting member launches the round (it has a stream; this one is leaving).
            self.0.turn.notify_all();
        }
    }
}
