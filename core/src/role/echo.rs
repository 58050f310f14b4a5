//! A toy role, for tests only: what adding a role takes. This module, plus in `role.rs`
//! its `Role` variant, its registry row and this `mod` line — no other file. An echo
//! node of the pub/sub family completes each `Submit` at once with the op as its
//! result, numbering requests as a PBFT client does; it takes no messages.

use crate::node::{Ctx, HandleError};
use crate::role::RoleMachine;
use crate::wire::Opened;
use crate::{Input, Nanos, Output, Request};

pub(crate) struct Echo {
    next_request: u64,
}

impl Echo {
    pub fn new(_: &Ctx) -> Self {
        Echo { next_request: 1 }
    }
}

impl RoleMachine for Echo {
    fn on_message(&mut self, _: &mut Ctx, _: Nanos, _: Opened) {}

    fn on_input(&mut self, ctx: &mut Ctx, _: Nanos, input: Input) -> Result<(), HandleError> {
        match input {
            Input::Request(Request::Submit { op }) => {
                ctx.push(Output::Completed { request: self.next_request, result: op });
                self.next_request += 1;
                Ok(())
            }
            other => Err(HandleError::WrongRole { role: ctx.role(), request: other.name() }),
        }
    }

    fn live_instances(&self) -> usize {
        0
    }

    fn next_request(&self) -> Option<u64> {
        Some(self.next_request)
    }
}

#[cfg(test)]
mod tests {
    use crate::crypto::CryptoMode;
    use crate::{ClusterSpec, Input, Node, Output, Protocol, Request, Role, generate_cluster};

    #[test]
    fn a_role_added_in_its_module_and_one_registry_row_runs() {
        assert_eq!(Role::from_name("echo"), Some(Role::Echo));
        assert_eq!(Role::Echo.protocol(), Protocol::PubSub);
        assert!(Protocol::PubSub.roles().any(|r| r == Role::Echo));

        let spec = ClusterSpec { crypto: CryptoMode::InsecureTest, ..ClusterSpec::new(1) };
        let mut cfgs = generate_cluster(&spec, [5; 32]).unwrap();
        // The last node (a subscriber) becomes an echo node, in every configuration.
        let id = cfgs.last().unwrap().id;
        for cfg in &mut cfgs {
            cfg.cluster.nodes.iter_mut().find(|n| n.id == id).unwrap().role = Role::Echo;
        }
        let decoded = crate::NodeConfig::decode(&cfgs.last().unwrap().encode()).unwrap();
        assert_eq!(decoded.cluster.node(id).unwrap().role, Role::Echo);

        let mut echo = Node::new(decoded).unwrap();
        assert_eq!((echo.role(), echo.next_request()), (Role::Echo, Some(1)));
        echo.handle(1, Input::Request(Request::Submit { op: b"hi".to_vec() })).unwrap();
        assert_eq!(echo.poll(), Some(Output::Completed { request: 1, result: b"hi".to_vec() }));
        let refused = echo.handle(2, Input::Request(Request::Subscribe { topics: vec![1] }));
        assert_eq!(refused.unwrap_err().to_string(), "a echo cannot handle a subscribe request");

        assert_eq!(echo.poll(), None);
        assert_eq!(echo.next_request(), Some(2));
    }
}
