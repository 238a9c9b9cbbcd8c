//! Hostile: allocates (and touches) memory without end.
fn main() {
    let mut held = Vec::new();
    loop {
        let mut block = vec![0u8; 1 << 20];
        block[0] = 1;
        held.push(std::hint::black_box(block));
    }
}
