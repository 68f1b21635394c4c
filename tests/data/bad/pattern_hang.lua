-- one string library call that backtracks for hours: no Lua instruction
-- runs meanwhile, so only the wall-clock bound (KILN_LUA_SECONDS) stops it
local s = string.rep("a", 20000)
local hit = s:find(".-.-.-.-b")
local x = param("x", {2}, zeros())
minimize(x:sum())
