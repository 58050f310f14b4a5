// The component's host-crypto import, from JavaScript: not offered, so the guest runs
// BLS with its own code (the fallback every host can rely on).
export function offered() {
  return false;
}

function notOffered(name) {
  return () => {
    throw new Error(`host-crypto.${name} called although offered() is false`);
  };
}

export const sign = notOffered("sign");
export const verify = notOffered("verify");
export const aggregate = notOffered("aggregate");
export const fastAggregateVerify = notOffered("fastAggregateVerify");
export const verifyPossession = notOffered("verifyPossession");
