//! The sandbox's side of the way out (W14): run inside a network namespace that has only
//! loopback, it listens on `127.0.0.1:<port>` (what `HTTP_PROXY` names) and carries each
//! connection to the session's proxy over a unix socket bound into the sandbox. It is the
//! only path out: nothing else in the namespace reaches beyond loopback.
//!
//! Usage: `egress-bridge <listen address> <unix socket path>`.

use anyhow::Context;
use tokio::net::{TcpListener, UnixStream};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (Some(listen), Some(socket)) = (args.next(), args.next()) else {
        anyhow::bail!("usage: egress-bridge <listen address> <unix socket path>");
    };
    let listener = TcpListener::bind(&listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    // What a launcher waits for before it starts the commands.
    println!("listening on {}", listener.local_addr()?);
    loop {
        let (mut client, _) = listener.accept().await?;
        let socket = socket.clone();
        tokio::spawn(async move {
            if let Ok(mut proxy) = UnixStream::connect(&socket).await {
                let _ = tokio::io::copy_bidirectional(&mut client, &mut proxy).await;
            }
        });
    }
}
