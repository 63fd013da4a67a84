-- needs: gcra
-- KEYS: rate scope (5) ; ARGV: rate args (11) -> {wait_ms, factor x1e6}
local wait, factor = rl_reserve(0, 0)
return {wait, math.floor(factor * 1000000)}
