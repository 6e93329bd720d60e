//! The order in which the residency rule parks a device's resident kernels: producers before
//! the kernels that consume their output rings on the device (device-side forwarding). Below
//! both launchers (the GPU's `Device::with_quiesced`, CudaSim's `with_all_quiesced`).

/// Orders kernels upstream first for a quiesce of all of them: a kernel whose output ring
/// another kernel consumes on the device parks before that consumer. Parking finishes the
/// batch in hand, outputs included, and a full output ring waits for its consumer: were the
/// consumer parked first, the producer could never park. `edge(k)` is `(k's output ring, the
/// peer ring k's slot names now or 0)`. Chains of any length; a cycle cannot loop forever.
pub fn upstream_first<T>(kernels: &mut [T], edge: impl Fn(&T) -> (u64, u64)) {
    let edges: Vec<(u64, u64)> = kernels.iter().map(&edge).collect();
    let hops = |i: usize| {
        let mut n = 0usize;
        let mut ring = edges[i].1;
        while ring != 0 && n < edges.len() {
            match edges.iter().find(|(out, _)| *out == ring) {
                Some((_, up)) => {
                    n += 1;
                    ring = *up;
                }
                None => break,
            }
        }
        n
    };
    let mut order: Vec<usize> = (0..kernels.len()).collect();
    order.sort_by_key(|&i| hops(i));
    // Apply the permutation: position p takes the kernel at order[p].
    let mut placed = vec![false; kernels.len()];
    for start in 0..kernels.len() {
        if placed[start] {
            continue;
        }
        let mut p = start;
        loop {
            placed[p] = true;
            let from = order[p];
            if from == start {
                break;
            }
            kernels.swap(p, from);
            p = from;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::upstream_first;

    #[test]
    fn producers_park_before_their_consumers() {
        // (name, out ring, peer ring): c consumes b's ring, b consumes a's, d is alone.
        let mut ks = vec![("c", 30, 20), ("d", 40, 0), ("b", 20, 10), ("a", 10, 0)];
        upstream_first(&mut ks, |k| (k.1, k.2));
        let pos = |n: &str| ks.iter().position(|k| k.0 == n).unwrap();
        assert!(pos("a") < pos("b") && pos("b") < pos("c"), "{ks:?}");
        // A cycle (never made by the runtime) still terminates.
        let mut cyc = vec![("x", 1, 2), ("y", 2, 1)];
        upstream_first(&mut cyc, |k| (k.1, k.2));
        assert_eq!(cyc.len(), 2);
    }
}
