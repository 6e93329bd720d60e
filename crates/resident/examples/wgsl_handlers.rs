//! A WGSL handler with device state on wgpu (`resident::guide::wgsl_handlers`). Run it with
//! `wgpu` (lavapipe works); on other backends the CPU closure runs.

mod common;

use resident::prelude::*;
use std::time::Duration;

device_message! { pub struct Order { pub price: f32, pub qty: u32 } }
device_message! { pub struct Fill { pub value: f32, pub qty: u32 } }
device_message! { pub struct Book { pub orders: u32, pub max_qty: u32 } }

const HANDLER: &str = r#"
fn handle(input: ResidentIn, out: ptr<function, ResidentOut>, env: Envelope) -> bool {
    atomicAdd(&state.orders, 1u);
    atomicMax(&state.max_qty, input.qty);
    (*out).value = input.price * f32(input.qty);
    (*out).qty = input.qty;
    return true;
}"#;

fn main() -> Result<(), resident::Error> {
    let rt = common::runtime();
    let book = rt.launch(
        RingKernel::<Order, Fill>::new("book")
            .batch_size(64)
            .handler(|_: &mut Context<()>, o: Order| {
                Some(Fill {
                    value: o.price * o.qty as f32,
                    qty: o.qty,
                })
            })
            .wgsl(WgslHandler::new(HANDLER).state(Book {
                orders: 0,
                max_qty: 0,
            })),
    )?;
    book.activate()?;
    println!("the handler runs on {:?}", book.placement());
    let t = Duration::from_secs(30);
    for qty in 1..=10u32 {
        assert_eq!(
            book.call(Order { price: 0.5, qty }, t)?.value,
            0.5 * qty as f32
        );
    }
    match book.snapshot_state::<Book>() {
        Ok(s) => {
            println!("device state: {} orders, largest {}", s.orders, s.max_qty);
            assert_eq!((s.orders, s.max_qty), (10, 10));
        }
        Err(e) => println!("no device state to read on this backend: {e}"),
    }
    Ok(())
}
