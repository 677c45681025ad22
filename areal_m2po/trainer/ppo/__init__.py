"""The PPO actor (proximal log-probs, the M2PO mask, advantages, the update), its loss and
advantage-estimator seams, and the critic; the maths they call is :mod:`areal_m2po.algo`'s."""
