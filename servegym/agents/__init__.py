"""Agents: the protocol every agent follows, and the agents that ship with ServeGym."""
