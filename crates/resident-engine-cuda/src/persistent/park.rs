//! The host's half of parking a resident kernel (the residency rule's quiesce), one rule for
//! both launchers: the GPU's (`kernel::GpuResident`) and CudaSim's (`sim::QuiesceShared`).
//!
//! A park asks the kernel to finish the batch in hand and exit (`RunState::Quiesce`); its
//! queues, indices, counters and state stay, and a resume relaunches it where it left off with
//! the run state the host last asked for. The launchers differ only in how they see a block
//! that has exited (a stream query; a launcher thread) and how they relaunch it (a driver
//! launch; waking that thread); what the host may write to the control block, and when, is
//! [`Parking`]'s alone. Each launcher keeps it under the lock that also covers its own
//! relaunch bookkeeping, so one lock orders every run-state write of a kernel.

use super::control::{ControlBlock, RunState};

/// Where a kernel stands with respect to parks. Every host write of the run state goes through
/// it, so a park never loses an activate, a deactivate or a terminate.
#[derive(Debug, Default)]
pub(super) struct Parking {
    /// A park was asked for and not resumed yet.
    parking: bool,
    /// The run state the host wants once resumed (an activate or deactivate while parked).
    want: Option<RunState>,
    /// Told to terminate: never asked to park again (a `Quiesce` written now would cover the
    /// `Terminate`, and its resume would relaunch a kernel whose memory may be freed by then),
    /// and a parked kernel is not relaunched just to exit: it has exited already.
    terminated: bool,
}

impl Parking {
    /// The host's run-state write: kept for the resume while a park is on, written at once
    /// otherwise. A terminate ends a park for good and is always written.
    pub(super) fn set_run_state(&mut self, ctl: &ControlBlock, rs: RunState) {
        if self.parking && rs != RunState::Terminate {
            self.want = Some(rs);
            return;
        }
        if rs == RunState::Terminate {
            self.parking = false;
            self.want = None;
            self.terminated = true;
        }
        ctl.set_run_state(rs);
    }

    /// Asks the kernel to park: it finishes its batch and exits. Nothing is written when a
    /// park is on already or the kernel was told to terminate (it is left to exit).
    pub(super) fn request(&mut self, ctl: &ControlBlock) {
        if !self.parking && !self.terminated {
            self.parking = true;
            self.want = ctl.run_state();
            ctl.set_run_state(RunState::Quiesce);
        }
    }

    /// Ends a park: writes the run state the host wants (inactive unless it asked for
    /// another) and returns `true`, and the launcher relaunches the block if it parked.
    /// `false`, with nothing written, when no park is on (none was asked for, or a terminate
    /// ended it).
    pub(super) fn resume(&mut self, ctl: &ControlBlock) -> bool {
        if !self.parking {
            return false;
        }
        self.parking = false;
        ctl.set_run_state(self.want.take().unwrap_or(RunState::Inactive));
        true
    }

    /// A park was asked for and not resumed yet (the GPU launcher's `check` tells a parked
    /// kernel's idle stream from an exit by it).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(super) fn is_parking(&self) -> bool {
        self.parking
    }

    /// The host told the kernel to terminate.
    pub(super) fn terminated(&self) -> bool {
        self.terminated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn control() -> Box<ControlBlock> {
        // SAFETY: every field of ControlBlock is an atomic integer or a byte array, for which
        // all-zero bytes are a valid value; Box allocates it with its 128-byte alignment.
        Box::new(unsafe { core::mem::zeroed() })
    }

    #[test]
    fn run_states_written_while_parked_wait_for_the_resume_and_the_last_one_wins() {
        let ctl = control();
        let mut p = Parking::default();
        p.set_run_state(&ctl, RunState::Active);
        assert_eq!(ctl.run_state(), Some(RunState::Active));
        p.request(&ctl);
        assert_eq!(ctl.run_state(), Some(RunState::Quiesce));
        assert!(p.is_parking());
        p.set_run_state(&ctl, RunState::Inactive);
        p.set_run_state(&ctl, RunState::Active);
        p.set_run_state(&ctl, RunState::Inactive);
        // Nothing reached the kernel while it parked: it would have unparked it.
        assert_eq!(ctl.run_state(), Some(RunState::Quiesce));
        // A second request while parked changes nothing, and keeps the wanted state.
        p.request(&ctl);
        assert!(p.resume(&ctl));
        assert_eq!(ctl.run_state(), Some(RunState::Inactive));
        assert!(!p.is_parking());
        // A resume with no park on writes nothing.
        p.set_run_state(&ctl, RunState::Active);
        assert!(!p.resume(&ctl));
        assert_eq!(ctl.run_state(), Some(RunState::Active));
    }

    #[test]
    fn a_park_keeps_the_state_the_kernel_had() {
        let ctl = control();
        let mut p = Parking::default();
        p.set_run_state(&ctl, RunState::Active);
        p.request(&ctl);
        assert!(p.resume(&ctl));
        assert_eq!(ctl.run_state(), Some(RunState::Active));
        // A kernel launched and never activated: the control block holds `Launched`, which
        // comes back as is.
        let ctl = control();
        ctl.set_run_state(RunState::Launched);
        let mut p = Parking::default();
        p.request(&ctl);
        assert!(p.resume(&ctl));
        assert_eq!(ctl.run_state(), Some(RunState::Launched));
    }

    #[test]
    fn a_terminate_ends_a_park_for_good_and_no_park_follows_it() {
        let ctl = control();
        let mut p = Parking::default();
        p.set_run_state(&ctl, RunState::Active);
        p.request(&ctl);
        p.set_run_state(&ctl, RunState::Terminate);
        assert_eq!(ctl.run_state(), Some(RunState::Terminate));
        assert!(p.terminated() && !p.is_parking());
        // The quiesce that parked it resumes: nothing to relaunch, the terminate stays.
        assert!(!p.resume(&ctl));
        assert_eq!(ctl.run_state(), Some(RunState::Terminate));
        // A later quiesce does not cover the terminate with a park.
        p.request(&ctl);
        assert_eq!(ctl.run_state(), Some(RunState::Terminate));
        assert!(!p.is_parking());
        assert!(!p.resume(&ctl));
    }
}
