-- a table bomb whose memory errors the script catches
local x = input("x", {4, 8})
local keep = {}
local function grow() while true do keep[#keep + 1] = string.rep("x", 1000) .. #keep end end -- ERROR
while true do pcall(grow) end
minimize(x:sum())
