//! Tries to open a TCP connection to the address on stdin (default
//! 127.0.0.1:9) and says what happened. A job has no network: built for
//! wasm32-wasip1 the connect fails inside the job; built for wasm32-wasip2
//! the component imports `wasi:sockets`, which refuses every socket.
fn main() {
    let mut addr = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut addr);
    let addr = if addr.trim().is_empty() {
        "127.0.0.1:9"
    } else {
        addr.trim()
    };
    match std::net::TcpStream::connect(addr) {
        Ok(_) => println!("connected to {addr}"),
        Err(e) => println!("cannot connect to {addr}: {e}"),
    }
}
