//! Starts a throwaway server from the installed binary on a free loopback port, prints
//! its store URL, and stops it when stdin closes: for benchmarks and manual runs against
//! a server that nothing else uses. Close stdin to stop it; a signal that kills this
//! process leaves the server running in its own process group.
//!
//! `tenure-serve postgres|mariadb|redis|etcd|nats|rabbitmq` (RabbitMQ prints an amqp:// broker URL)

use std::io::Read;

use tenure_testkit::servers::{self, Kind};

fn main() -> std::process::ExitCode {
    if std::env::args().nth(1).is_some_and(|a| a == "--help" || a == "-h") {
        println!(
            "usage: tenure-serve KIND (one of {})\n\nStarts a throwaway server of KIND from its installed binary on a \
             free loopback port, prints its URL, and stops it when standard input closes.",
            servers::KIND_NAMES
        );
        return std::process::ExitCode::SUCCESS;
    }
    let kind = match std::env::args().nth(1).map(|a| a.parse::<Kind>()) {
        Some(Ok(kind)) => kind,
        Some(Err(e)) => {
            eprintln!("tenure-serve: {e}");
            return std::process::ExitCode::from(2);
        }
        None => {
            eprintln!("usage: tenure-serve KIND (one of {})", servers::KIND_NAMES);
            return std::process::ExitCode::from(2);
        }
    };
    let Some(server) = servers::launch(kind) else {
        eprintln!("tenure-serve: the server binary is not installed");
        return std::process::ExitCode::from(1);
    };
    println!("{}", server.url());
    // Until stdin closes; the launcher's drop stops the server.
    let _ = std::io::stdin().read_to_end(&mut Vec::new());
    drop(server);
    std::process::ExitCode::SUCCESS
}
