//! Job slots shared fairly between tenants. A free slot goes to the waiting tenant with the
//! fewest jobs running (then the one served least recently, then the oldest waiter), never
//! simply to whoever queued first: a tenant with a thousand jobs queued delays another tenant's next job by at most
//! one job, not by its whole queue. Each tenant also has its own bounds on jobs running and
//! waiting, so it cannot fill the shared queue.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// One tenant's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantBounds {
    /// Jobs of the tenant running at once.
    pub max_running: usize,
    /// Jobs of the tenant waiting for a slot.
    pub max_waiting: usize,
}

impl TenantBounds {
    /// No bound of its own: only the server's slots and queue hold the tenant back.
    pub const UNBOUNDED: TenantBounds = TenantBounds {
        max_running: usize::MAX,
        max_waiting: usize::MAX,
    };
}

/// Why a job could not even wait for a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueRefusal {
    /// The server's queue is full.
    ServerQueueFull,
    /// The tenant has as many jobs waiting as it may.
    TenantQueueFull,
}

/// What [`FairSlots::try_acquire`] gives.
#[derive(Debug)]
pub enum Acquire {
    /// A slot, at once.
    Granted(SlotPermit),
    /// A place in the queue; await [`Waiting::granted`].
    Queued(Waiting),
}

struct Waiter {
    ticket: u64,
    wake: oneshot::Sender<()>,
}

#[derive(Default)]
struct TenantLoad {
    running: usize,
    max_running: usize,
    /// When the tenant last got a slot (a count of grants; 0: not since it was idle).
    last_grant: u64,
    waiting: VecDeque<Waiter>,
}

struct State {
    free: usize,
    waiting: usize,
    next_ticket: u64,
    grants: u64,
    tenants: HashMap<String, TenantLoad>,
}

impl State {
    /// Hands free slots to waiters, the tenant with the fewest jobs running first.
    fn dispatch(&mut self) {
        while self.free > 0 {
            let next = self
                .tenants
                .iter()
                .filter(|(_, load)| load.running < load.max_running)
                .filter_map(|(name, load)| {
                    load.waiting
                        .front()
                        .map(|w| (load.running, load.last_grant, w.ticket, name.clone()))
                })
                .min();
            let Some((_, _, _, name)) = next else {
                return;
            };
            let Some(load) = self.tenants.get_mut(&name) else {
                return;
            };
            let Some(waiter) = load.waiting.pop_front() else {
                return;
            };
            self.waiting -= 1;
            // A waiter whose receiver is gone took itself out of the queue on drop; a send
            // fails only for one leaked without dropping, and then the slot stays free.
            if waiter.wake.send(()).is_ok() {
                load.running += 1;
                self.grants += 1;
                load.last_grant = self.grants;
                self.free -= 1;
            }
        }
    }

    fn release(&mut self, tenant: &str) {
        if let Some(load) = self.tenants.get_mut(tenant) {
            load.running = load.running.saturating_sub(1);
            if load.running == 0 && load.waiting.is_empty() {
                self.tenants.remove(tenant);
            }
        }
        self.free += 1;
        self.dispatch();
    }
}

/// The server's job slots and queue, shared between tenants.
pub struct FairSlots {
    state: Mutex<State>,
    queue: usize,
}

impl std::fmt::Debug for FairSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairSlots")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

impl FairSlots {
    /// `slots` jobs running at once, `queue` waiting (all tenants together).
    pub fn new(slots: usize, queue: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                free: slots,
                waiting: 0,
                next_ticket: 0,
                grants: 0,
                tenants: HashMap::new(),
            }),
            queue,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves counts that are still consistent (every
        // update is a single step), so a poisoned lock is taken as is.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Jobs waiting now, all tenants together.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Takes a slot for `tenant` when one is free and no job of the tenant waits before
    /// this one, else a place in the queue, else why not.
    pub fn try_acquire(
        self: &Arc<Self>,
        tenant: &str,
        bounds: TenantBounds,
    ) -> Result<Acquire, QueueRefusal> {
        let mut guard = self.lock();
        let State {
            free,
            waiting,
            next_ticket,
            grants,
            tenants,
        } = &mut *guard;
        let load = tenants.entry(tenant.to_owned()).or_default();
        load.max_running = bounds.max_running.max(1);
        if *free > 0 && load.waiting.is_empty() && load.running < load.max_running {
            load.running += 1;
            *grants += 1;
            load.last_grant = *grants;
            *free -= 1;
            return Ok(Acquire::Granted(SlotPermit {
                slots: self.clone(),
                tenant: tenant.to_owned(),
            }));
        }
        let refusal = if load.waiting.len() >= bounds.max_waiting {
            Some(QueueRefusal::TenantQueueFull)
        } else if *waiting >= self.queue {
            Some(QueueRefusal::ServerQueueFull)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            if load.running == 0 && load.waiting.is_empty() {
                tenants.remove(tenant);
            }
            return Err(refusal);
        }
        let ticket = *next_ticket;
        let (wake, woken) = oneshot::channel();
        load.waiting.push_back(Waiter { ticket, wake });
        *waiting += 1;
        *next_ticket += 1;
        Ok(Acquire::Queued(Waiting {
            slots: self.clone(),
            tenant: tenant.to_owned(),
            ticket,
            woken: Some(woken),
        }))
    }
}

/// A job's place in the queue. Dropping it leaves the queue (or gives back a slot granted
/// but not yet taken).
pub struct Waiting {
    slots: Arc<FairSlots>,
    tenant: String,
    ticket: u64,
    woken: Option<oneshot::Receiver<()>>,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("tenant", &self.tenant)
            .field("ticket", &self.ticket)
            .finish()
    }
}

impl Waiting {
    /// Waits for the slot the dispatcher grants this job.
    pub async fn granted(mut self) -> SlotPermit {
        if let Some(woken) = self.woken.as_mut() {
            // The sender lives in the queue until it is used (or the whole FairSlots goes,
            // which outlives every Waiting by its Arc): an error cannot happen, and would
            // mean the slot was granted anyway.
            let _ = woken.await;
        }
        self.woken = None;
        SlotPermit {
            slots: self.slots.clone(),
            tenant: std::mem::take(&mut self.tenant),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(mut woken) = self.woken.take() else {
            return;
        };
        let mut state = self.slots.lock();
        let mut removed = false;
        if let Some(load) = state.tenants.get_mut(&self.tenant)
            && let Some(at) = load.waiting.iter().position(|w| w.ticket == self.ticket)
        {
            load.waiting.remove(at);
            removed = true;
        }
        if removed {
            state.waiting -= 1;
            if let Some(load) = state.tenants.get(&self.tenant)
                && load.running == 0
                && load.waiting.is_empty()
            {
                state.tenants.remove(&self.tenant);
            }
            // A waiter held back only by its tenant's own bound may now be first.
            state.dispatch();
        } else if woken.try_recv().is_ok() {
            // Granted while the job gave up: the slot goes to the next waiter.
            state.release(&self.tenant);
        }
    }
}

/// A job slot, held until dropped.
pub struct SlotPermit {
    slots: Arc<FairSlots>,
    tenant: String,
}

impl std::fmt::Debug for SlotPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotPermit")
            .field("tenant", &self.tenant)
            .finish()
    }
}

impl Drop for SlotPermit {
    fn drop(&mut self) {
        self.slots.lock().release(&self.tenant);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(acquire: Result<Acquire, QueueRefusal>) -> SlotPermit {
        match acquire {
            Ok(Acquire::Granted(permit)) => permit,
            other => panic!("expected a slot: {other:?}"),
        }
    }

    fn queued(acquire: Result<Acquire, QueueRefusal>) -> Waiting {
        match acquire {
            Ok(Acquire::Queued(waiting)) => waiting,
            other => panic!("expected a queue place: {other:?}"),
        }
    }

    fn bounds(max_running: usize, max_waiting: usize) -> TenantBounds {
        TenantBounds {
            max_running,
            max_waiting,
        }
    }

    #[tokio::test]
    async fn a_freed_slot_goes_to_the_tenant_with_fewer_jobs_running_not_the_oldest_waiter() {
        let slots = FairSlots::new(2, 100);
        let a1 = granted(slots.try_acquire("a", bounds(8, 8)));
        let _a2 = granted(slots.try_acquire("a", bounds(8, 8)));
        let a3 = queued(slots.try_acquire("a", bounds(8, 8)));
        let a4 = queued(slots.try_acquire("a", bounds(8, 8)));
        let b1 = queued(slots.try_acquire("b", bounds(8, 8)));
        assert_eq!(slots.waiting(), 3);
        drop(a1);
        // b has nothing running, a has one: b's job is first although a's waited longer.
        let b1 = tokio::time::timeout(std::time::Duration::from_secs(5), b1.granted())
            .await
            .expect("b was not given the freed slot");
        assert_eq!(slots.waiting(), 2);
        drop(b1);
        let _a3 = a3.granted().await;
        assert_eq!(slots.waiting(), 1);
        drop(a4);
        assert_eq!(slots.waiting(), 0);
    }

    #[tokio::test]
    async fn between_tenants_with_as_many_running_the_one_served_least_recently_goes_first() {
        let slots = FairSlots::new(1, 100);
        let a1 = granted(slots.try_acquire("a", bounds(8, 8)));
        let a2 = queued(slots.try_acquire("a", bounds(8, 8)));
        let b1 = queued(slots.try_acquire("b", bounds(8, 8)));
        drop(a1);
        // Neither runs a job now; a was served last, so b goes first though a queued first.
        let b1 = tokio::time::timeout(std::time::Duration::from_secs(5), b1.granted())
            .await
            .expect("b was not served first");
        drop(b1);
        let _a2 = a2.granted().await;
    }

    #[test]
    fn a_tenant_at_its_queue_bound_is_refused_while_another_still_queues() {
        let slots = FairSlots::new(1, 3);
        let _a1 = granted(slots.try_acquire("a", bounds(8, 2)));
        let _a2 = queued(slots.try_acquire("a", bounds(8, 2)));
        let _a3 = queued(slots.try_acquire("a", bounds(8, 2)));
        assert_eq!(
            slots.try_acquire("a", bounds(8, 2)).unwrap_err(),
            QueueRefusal::TenantQueueFull
        );
        let _b1 = queued(slots.try_acquire("b", bounds(8, 2)));
        assert_eq!(
            slots.try_acquire("b", bounds(8, 2)).unwrap_err(),
            QueueRefusal::ServerQueueFull
        );
    }

    #[tokio::test]
    async fn a_tenant_at_its_running_bound_leaves_free_slots_to_others() {
        let slots = FairSlots::new(3, 10);
        let _a1 = granted(slots.try_acquire("a", bounds(1, 8)));
        let a2 = queued(slots.try_acquire("a", bounds(1, 8)));
        let _b1 = granted(slots.try_acquire("b", bounds(1, 8)));
        drop(a2);
        assert_eq!(slots.waiting(), 0);
        let _c1 = granted(slots.try_acquire("c", bounds(1, 8)));
    }

    #[tokio::test]
    async fn a_slot_granted_to_a_waiter_that_gave_up_goes_to_the_next() {
        let slots = FairSlots::new(1, 10);
        let a1 = granted(slots.try_acquire("a", bounds(8, 8)));
        let gives_up = queued(slots.try_acquire("b", bounds(8, 8)));
        let next = queued(slots.try_acquire("c", bounds(8, 8)));
        drop(a1);
        // Granted to b, which never claims it.
        drop(gives_up);
        let _c = tokio::time::timeout(std::time::Duration::from_secs(5), next.granted())
            .await
            .expect("the abandoned slot was lost");
        assert_eq!(slots.waiting(), 0);
    }
}
