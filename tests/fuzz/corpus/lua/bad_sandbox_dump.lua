-- string.dump would make bytecode: not available
local x = input("x", {4, 8})
local code = string.dump(function() return 1 end) -- ERROR
minimize(x:sum())
