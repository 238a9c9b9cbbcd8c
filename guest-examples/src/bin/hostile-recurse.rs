//! Hostile: recurses without end.
#![allow(unconditional_recursion)]
fn deeper(n: u64) -> u64 {
    let frame = std::hint::black_box([n; 16]);
    deeper(n + 1).wrapping_add(frame[3])
}

fn main() {
    println!("{}", deeper(0));
}
