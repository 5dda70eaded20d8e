//! The resident budget of gVisor pods (`[gvisor] resident_mb`): after a pod starts or is
//! restored, and before, idle pods (every sandbox paused) are parked at once, least recently
//! used first, until the running pods and one more fit. Parked pods cost no memory, so a
//! host holds as many sites as its disk allows and as many running as its memory does.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::slot::{PodSlot, PodState};
use super::Inner;

/// What a pod is assumed to hold until pods have been measured.
const FIRST_ESTIMATE: u64 = 64 << 20;

/// Which of `idle` (last used, bytes) to park, least recently used first, so that `used`
/// less what they hold, plus `need`, fits in `budget`: their indexes (all of them when even
/// that does not fit).
pub(crate) fn to_park(used: u64, need: u64, budget: u64, idle: &[(u64, u64)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..idle.len()).collect();
    order.sort_by_key(|&i| idle[i].0);
    let mut used = used;
    let mut chosen = Vec::new();
    for i in order {
        if used + need <= budget {
            break;
        }
        used = used.saturating_sub(idle[i].1);
        chosen.push(i);
    }
    chosen
}

impl Inner {
    /// Make room for one more running pod besides `this` (whose state lock the caller holds):
    /// park idle pods now, least recently used first, until the running ones and the new one
    /// fit in the resident budget. A pod whose state is busy (being parked, restored) is
    /// passed over; when nothing more can be parked the new pod starts anyway, over budget,
    /// and is counted. Without `this`, room is made ahead, off any request's path, for the
    /// next pod to come (after each start or restore), so that one rarely waits for a park.
    pub(super) async fn make_room(self: &Arc<Self>, this: Option<&Arc<PodSlot>>) {
        let (Some(budget), Some(layout)) = (self.settings.cfg.resident_bytes, &self.layout) else { return };
        let others = |s: &&Arc<PodSlot>| this.is_none_or(|this| !Arc::ptr_eq(s, this));
        let slots: Vec<Arc<PodSlot>> = self.pods.lock().expect("pods lock").values().filter(others).cloned().collect();
        let mut used = 0;
        let mut running = 0;
        let mut idle = Vec::new();
        for slot in slots {
            let Some(pod) = slot.running() else { continue };
            let bytes = layout.memory_in_use_of(&pod.cgroup);
            used += bytes;
            running += 1;
            if slot.all_paused() {
                idle.push((slot.last_used.load(Ordering::Relaxed), bytes, slot));
            }
        }
        let need = used.checked_div(running).unwrap_or(FIRST_ESTIMATE);
        let figures: Vec<(u64, u64)> = idle.iter().map(|(at, bytes, _)| (*at, *bytes)).collect();
        let chosen = to_park(used, need, budget, &figures);
        let freed: u64 = chosen.iter().map(|&i| figures[i].1).sum();
        if this.is_some() && used.saturating_sub(freed) + need > budget {
            self.parking.over_budget.fetch_add(1, Ordering::Relaxed);
        }
        for i in chosen {
            let slot = &idle[i].2;
            // Ahead of need, parks take turns with the others in the background; for a
            // request, at once.
            let _turn = match this {
                None => match self.park_turn.acquire().await {
                    Ok(_) if self.background.is_closed() => return,
                    Ok(turn) => Some(turn),
                    Err(_) => return,
                },
                Some(_) => None,
            };
            let Ok(state) = slot.state.try_lock() else { continue };
            if !matches!(*state, PodState::Running(_)) || !slot.all_paused() {
                continue;
            }
            if this.is_some() {
                self.parking.waited_for.fetch_add(1, Ordering::Relaxed);
            }
            self.park_locked(slot, state, this.is_none()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_recently_used_idle_pods_go_until_the_new_one_fits() {
        let idle = [(30, 100), (10, 100), (20, 50)];
        assert_eq!(to_park(500, 100, 1000, &idle), Vec::<usize>::new());
        assert_eq!(to_park(950, 100, 1000, &idle), vec![1]);
        assert_eq!(to_park(1000, 100, 1000, &idle), vec![1]);
        assert_eq!(to_park(1050, 100, 1000, &idle), vec![1, 2]);
    }

    #[test]
    fn when_nothing_more_can_go_all_idle_ones_go() {
        assert_eq!(to_park(2000, 100, 1000, &[(5, 10), (1, 10)]), vec![1, 0]);
        assert_eq!(to_park(2000, 100, 1000, &[]), Vec::<usize>::new());
    }
}
