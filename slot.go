package admit

import (
	"strconv"
	"strings"
)

// checkSameSlot refuses two keys of one call, a and b (described as
// what), that hash to different cluster slots: valkey-go's cluster
// client would panic building the command. tag is a hash tag to suggest.
func checkSameSlot(what, a, b, tag string) error {
	if s1, s2 := keySlot(a), keySlot(b); s1 != s2 {
		return crossSlot(what + " " + strconv.Quote(a) + " (slot " + strconv.Itoa(int(s1)) + ") and " + strconv.Quote(b) +
			" (slot " + strconv.Itoa(int(s2)) + ") are in different cluster hash slots; give them a common hash tag such as " + tag)
	}
	return nil
}

// keySlot returns the Valkey Cluster hash slot of key: CRC16 (XMODEM) modulo
// 16384, hashing only the hash tag when the key has one. A hash tag is the
// part between the first "{" and the first "}" after it, when non-empty.
// valkey-go exports no slot function, and its cluster client panics while
// building a command whose keys are in different slots, so the slots are
// checked here first.
func keySlot(key string) uint16 {
	part, _ := slotPart(key)
	return crc16(part) & 16383
}

// slotPart returns the part of key that the cluster hashes: its hash tag
// (tagged true), or the whole key when it has none.
func slotPart(key string) (part string, tagged bool) {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return key, false
	}
	close := strings.IndexByte(key[open+1:], '}')
	if close <= 0 { // no "}", or an empty tag "{}"
		return key, false
	}
	return key[open+1 : open+1+close], true
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc = crc<<8 ^ crc16Table[byte(crc>>8)^s[i]]
	}
	return crc
}

// crc16Table is CRC16-CCITT (XMODEM), polynomial 0x1021, as the cluster
// specification prescribes.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		crc := uint16(i) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
		t[i] = crc
	}
	return t
}()
