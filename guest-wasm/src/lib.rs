//! The Phalanx core as a WebAssembly component: exports `wit/phalanx.wit`'s `node`
//! interface over [`phalanx_core::Node`], unchanged. What crosses is the core's boundary
//! vocabulary ([`phalanx_core::boundary`]), so there is nothing to convert here. Built for
//! wasm32-unknown-unknown (scripts/build-wasm), it has no WASI: no clock, file,
//! randomness or stderr. Its one import is the optional `host-crypto`; a panic
//! (panic = "abort") is a trap.

use std::cell::RefCell;

use phalanx_core::Node;
use phalanx_core::boundary::{self, Round};
use phalanx_core::crypto::{BlsBackend, BlsPublicKey, BlsSecretKey, BlsSignature, CryptoMode};
use phalanx_core::trace::{Trace, replay as replay_trace};

mod alloc;

#[global_allocator]
static ALLOCATOR: alloc::SizeClasses = alloc::SizeClasses::new();

wit_bindgen::generate!({ path: "../wit", world: "phalanx" });

use exports::phalanx::node::node::{CryptoBackend, Guest, GuestMachine, Machine as MachineHandle};
use phalanx::node::host_crypto;

struct Component;

/// BLS by the host, natively.
struct HostBls;

impl BlsBackend for HostBls {
    fn sign(&self, sk: &BlsSecretKey, msg: &[u8]) -> BlsSignature {
        let sig = host_crypto::sign(sk.key_material(), msg);
        // A host that answers with anything but a signature is broken beyond recovery.
        BlsSignature(sig.try_into().expect("host-crypto sign returns 96 bytes"))
    }

    fn verify(&self, pk: &BlsPublicKey, msg: &[u8], sig: &BlsSignature) -> bool {
        host_crypto::verify(&pk.0, msg, &sig.0)
    }

    fn aggregate(&self, sigs: &[BlsSignature]) -> Option<BlsSignature> {
        let sigs: Vec<Vec<u8>> = sigs.iter().map(|s| s.0.to_vec()).collect();
        host_crypto::aggregate(&sigs).and_then(|a| a.try_into().ok()).map(BlsSignature)
    }

    fn fast_aggregate_verify(&self, pks: &[BlsPublicKey], msg: &[u8], agg: &BlsSignature) -> bool {
        let keys: Vec<Vec<u8>> = pks.iter().map(|pk| pk.0.to_vec()).collect();
        host_crypto::fast_aggregate_verify(&keys, msg, &agg.0)
    }

    fn validate_with_pop(&self, pk: &BlsPublicKey, pop: &BlsSignature) -> bool {
        host_crypto::verify_possession(&pk.0, &pop.0)
    }
}

/// One node. The component model hands resources out by shared reference.
struct NodeMachine {
    node: RefCell<Node>,
    crypto: CryptoBackend,
}

impl Guest for Component {
    type Machine = NodeMachine;

    fn replay(trace: Vec<u8>) -> Result<String, String> {
        let trace = Trace::parse(&trace).map_err(|e| e.to_string())?;
        replay_trace(&trace).map(|summary| summary.to_string()).map_err(|e| e.to_string())
    }
}

impl GuestMachine for NodeMachine {
    fn create(config: Vec<u8>) -> Result<MachineHandle, String> {
        let offered = host_crypto::offered();
        // The proofs of possession checked at creation too: in the sandbox, a pairing
        // costs tens of milliseconds.
        let node = if offered {
            Node::from_config_bytes_by(&config, Box::new(HostBls))
        } else {
            Node::from_config_bytes(&config)
        };
        let node = node.map_err(|e| e.0)?;
        let crypto = match node.config().cluster.crypto {
            CryptoMode::InsecureTest => CryptoBackend::InsecureTest,
            CryptoMode::Real if offered => CryptoBackend::Host,
            CryptoMode::Real => CryptoBackend::Guest,
        };
        Ok(MachineHandle::new(NodeMachine { node: RefCell::new(node), crypto }))
    }

    fn run(&self, inputs: Vec<u8>) -> Result<Vec<u8>, String> {
        let inputs = boundary::decode_inputs(inputs).map_err(|e| e.to_string())?;
        // Only in the `fault-injection` build, which exists so that the host's fault tests
        // can make the guest trap, or run forever, on demand.
        #[cfg(feature = "fault-injection")]
        for (_, input) in &inputs {
            if let phalanx_core::Input::Request(phalanx_core::Request::Submit { op }) = input {
                match &op[..] {
                    b"phalanx:trap" => panic!("fault injection: a trap on request"),
                    b"phalanx:spin" => loop {
                        std::hint::black_box(());
                    },
                    _ => {}
                }
            }
        }
        Ok(Round::run_node(&mut self.node.borrow_mut(), inputs).encode())
    }

    fn next_request(&self) -> Option<u64> {
        self.node.borrow().next_request()
    }

    fn status(&self) -> Vec<u8> {
        let node = self.node.borrow();
        boundary::encode_status(&node.status(), node.stats())
    }

    fn crypto_backend(&self) -> CryptoBackend {
        self.crypto
    }
}

export!(Component);
