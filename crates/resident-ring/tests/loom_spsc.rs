//! Model check of the SPSC ring protocol with loom: every interleaving of one producer and one
//! consumer (within loom's bounds) delivers every value exactly once, in order, and never
//! reads a slot before it is written or overwrites one before it is read (loom's cell tracking
//! flags such a race).
//!
//! Run: `RUSTFLAGS="--cfg loom" cargo test -p resident-ring --test loom_spsc --release`
#![cfg(loom)]

use resident_ring::spsc::Ring;

#[test]
fn spsc_delivers_in_order_across_wraparound() {
    loom::model(|| {
        // Capacity 2 with 3 values forces a wrap-around and a full ring.
        let (mut tx, mut rx) = Ring::<u32>::new(2).unwrap();
        let producer = loom::thread::spawn(move || {
            let mut next = 0;
            while next < 3 {
                if tx.push(next).is_ok() {
                    next += 1;
                } else {
                    loom::thread::yield_now();
                }
            }
        });
        let mut expect = 0;
        while expect < 3 {
            match rx.pop() {
                Some(v) => {
                    assert_eq!(v, expect);
                    expect += 1;
                }
                None => loom::thread::yield_now(),
            }
        }
        producer.join().unwrap();
        assert_eq!(rx.pop(), None);
    });
}

#[test]
fn spsc_batches_publish_whole_batches() {
    loom::model(|| {
        let (mut tx, mut rx) = Ring::<u32>::new(4).unwrap();
        let producer = loom::thread::spawn(move || {
            let mut sent = 0;
            while sent < 4 {
                sent += tx.push_slice(&[sent as u32, sent as u32 + 1][..(4 - sent).min(2)]);
                if sent < 4 {
                    loom::thread::yield_now();
                }
            }
        });
        let mut got = Vec::new();
        while got.len() < 4 {
            if rx.pop_into(&mut got, 3) == 0 {
                loom::thread::yield_now();
            }
        }
        producer.join().unwrap();
        assert_eq!(got, vec![0, 1, 2, 3]);
    });
}
