-- one library call that neither runs Lua code nor allocates (it moves nils
-- between empty tables 10^12 times): the watchdog ends the process
local x = input("x", {4, 8})
table.move({}, 1, 1e12, 1, {}) -- ERROR
minimize(x:sum())
